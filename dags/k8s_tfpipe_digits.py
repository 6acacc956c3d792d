"""Airflow DAG: the digits pipeline on Kubernetes: the same stages as ``tfpipe_digits``, as pods.

``backend="kubernetes"`` turns the same stage specs into ``KubernetesPodOperator``s (install the
extra: ``pip install './[kubernetes]'``): GPUs as ``nvidia.com/gpu`` limits on the train and
evaluate pods, work and models on PersistentVolumeClaims, the raw data on a read-only hostPath,
non-root pods on GPU nodes. It needs a cluster with NVIDIA's device plugin, the claims below and
the trainer image in a registry the nodes can pull from (named by the Airflow Variable
``tfpipe_image``); none of that exists where this project is tested, so this DAG is parsed and its
pods are built in the tests, never run (see the README).

In an Airflow without the Kubernetes provider this file builds no DAG and logs why, instead of
showing as an import error: ``dags/`` can be copied whole into a plain Docker deployment.
"""

from __future__ import annotations

import importlib.util
import logging
import os

# Named here so Airflow's DAG processor imports tfpipe (and the Docker provider under it) once,
# before it forks the process that parses this file ([dag_processor] parsing_pre_import_modules, on
# by default; only airflow.* imports count), instead of in every parse (docs/deploying.md, "The DAG processor's pre-import").
import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline


def _kubernetes_provider_installed() -> bool:
    # find_spec, not an import statement: the DAG processor pre-imports every airflow.* module a
    # file imports, and would warn about the missing provider at each parse
    try:
        return importlib.util.find_spec("airflow.providers.cncf.kubernetes") is not None
    except ImportError:  # airflow.providers.cncf itself is missing
        return False


if not _kubernetes_provider_installed():
    logging.getLogger(__name__).info(
        "k8s_tfpipe_digits: not built: the Kubernetes provider (apache-airflow-providers-cncf-kubernetes) "
        "is not installed. Fix: pip install 'airflow-provider-tfpipe[kubernetes]' to run it, or leave "
        "this example out of a deployment that runs on Docker")
else:
    dag = training_pipeline(
        PipelineConfig(
            dag_id="k8s_tfpipe_digits",
            description="Digits on Kubernetes: prep -> validate -> train -> evaluate -> export as pods",
            schedule=None,
            tags=("tfpipe", "kubernetes"),
            backend="kubernetes",
            # the deployment's image (the Airflow Variable tfpipe_image, read when a pod is built); on a
            # cluster it must name a registry the nodes pull from. TFPIPE_K8S_IMAGE pins one here instead.
            image={"ref": os.environ.get("TFPIPE_K8S_IMAGE")},
            volumes={"data": "/srv/tfpipe/data", "work": "/srv/tfpipe/work", "models": "/srv/tfpipe/models"},
            kubernetes={"namespace": "ml-training", "claims": {"work": "tfpipe-work", "models": "tfpipe-models"}},
            data={"path": "digits/digits.csv"},
            training={"model": "mlp", "epochs": 10},
            evaluation={"metric": "macro_f1", "threshold": 0.9},
            export={"model_name": "digits"},
            resources={"gpus": 1, "mem_limit": "8g", "shm_size": "2g",
                       "node_selector": {"nvidia.com/gpu.present": "true"},
                       "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        )
    )
