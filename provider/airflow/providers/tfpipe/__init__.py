"""Named by tfpipe DAG files so Airflow's DAG processor imports tfpipe's DAG-building modules once, before it forks.

The processor pre-imports only ``airflow.*`` modules a DAG file names
(``[dag_processor] parsing_pre_import_modules``). Optional backends are left out; the public API is :mod:`tfpipe`.
"""

import tfpipe.dag_factory  # noqa: F401
import tfpipe.operators.retention  # noqa: F401
import tfpipe.operators.register  # noqa: F401
