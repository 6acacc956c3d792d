"""Named by tfpipe DAG files, so that Airflow's DAG processor imports tfpipe once, not every parse.

Before it forks the process that parses a DAG file, Airflow's DAG processor imports the
``airflow.*`` modules the file names (``[dag_processor] parsing_pre_import_modules``, on by
default); every parse of the file then finds them loaded. tfpipe's package is ``tfpipe``, which that
rule never matches, so a DAG file that names only ``tfpipe`` imports tfpipe's modules again in every
parse. This module is under ``airflow.providers`` (a namespace package that provider distributions
share) and imports what building any tfpipe DAG on the Docker backend needs: the config, the specs,
the stage operators with the Docker provider under them, and the cleanup task's operator. A DAG
file that names it::

    import airflow.providers.tfpipe  # noqa: F401
    from tfpipe import PipelineConfig, training_pipeline

parses in about the time of the same DAG written by hand (``in_dag_processor`` of
``dag_parse_ratio``, bench/README.md). The public API stays in :mod:`tfpipe`; nothing else lives
here. Modules only some pipelines need (the Cloud Storage operators, the sharded prep operators, the
Kubernetes operators) are left out: a worker's or a fresh interpreter's parse imports this module
too, and there they would cost every other pipeline's parse.
"""

import tfpipe.dag_factory  # noqa: F401
import tfpipe.operators.retention  # noqa: F401
