"""README's example DAG file ("Using the provider in an existing Airflow deployment") builds the DAG
its comments describe, exactly as printed there: the block is read from README.md and run."""

from __future__ import annotations

import re

from tests.conftest import REPO
from tests.provider.test_dags import _scheduled


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    found = [block for block in blocks if 'dag_id="churn_model"' in block]
    assert len(found) == 1, "README's example DAG file (dag_id churn_model) is not one python block"
    return found[0]


def test_the_readme_example_dag_file_builds_the_dag_it_describes():
    namespace: dict = {}
    exec(compile(_example(), "README.md (example DAG file)", "exec"), namespace)
    dag = namespace["dag"]
    assert dag.dag_id == "churn_model"
    # no bucket settings: no Cloud Storage tasks
    assert set(dag.task_ids) == {"prep", "train", "evaluate", "export", "cleanup"}
    assert _scheduled(dag).summary == "0 3 * * *"
    train = dag.get_task("train")
    assert train.image == "registry.local/tfpipe/trainer:3f2a9c1b7e4d"
    assert train.docker_url == "tcp://gpu-host-1:2376"
    assert [(m.source, m.target) for m in train.spec.mounts][:3] == [
        ("/srv/ml/raw", "/data"), ("/srv/ml/work", "/work"), ("/srv/ml/models", "/models")]
    assert train.spec.gpus is not None and train.spec.gpus.count == -1  # "all"
    assert train.mem_limit == "16g" and train.nano_cpus == 8_000_000_000  # cpus: Docker --cpus per stage
    assert train.environment["TZ"] == "Asia/Shanghai"
    config = dag.get_task("evaluate").spec.config
    assert {k: config["data"][k] for k in ("path", "format", "label")} == {
        "path": "churn/", "format": "csv", "label": "churned"}
    assert {k: config["training"][k] for k in ("model", "epochs", "batch_size", "class_weight")} == {
        "model": "mlp", "epochs": 30, "batch_size": 256, "class_weight": "balanced"}
    assert config["evaluation"] == {"metric": "macro_f1", "threshold": 0.85, "tolerance": 0.01}
    assert config["export"]["model_name"] == "churn"
