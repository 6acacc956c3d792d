"""README's example DAG file is ``docs/examples/churn_model.py`` as it is, and that file builds the
DAG its comments describe. README is plain Markdown (it is also the package's description on the
package index), so it carries a copy of the file; this keeps the copy and the file one text."""

from __future__ import annotations

import re

from tests.conftest import REPO
from tests.provider.test_dags import _scheduled

EXAMPLE = REPO / "docs" / "examples" / "churn_model.py"


def test_readme_s_example_dag_is_the_docs_example_file_as_it_is():
    """The one python block of README that builds a pipeline is the example file, byte for byte."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    found = [block for block in blocks if "training_pipeline(" in block]
    assert len(found) == 1, "README's example DAG file is not one python block"
    assert found[0] == EXAMPLE.read_text()


def test_the_example_dag_file_builds_the_dag_it_describes():
    namespace: dict = {}
    exec(compile(EXAMPLE.read_text(), str(EXAMPLE), "exec"), namespace)
    dag = namespace["dag"]
    assert dag.dag_id == "churn_model"
    # no bucket settings: no Cloud Storage tasks
    assert set(dag.task_ids) == {"prep", "validate", "train", "evaluate", "export", "cleanup", "register"}
    assert _scheduled(dag).summary == "0 3 * * *"
    train = dag.get_task("train")
    assert train.image == "registry.local/tfpipe/trainer:1.4.0"
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
    assert {k: config["evaluation"][k] for k in ("metric", "threshold", "tolerance")} == {
        "metric": "macro_f1", "threshold": 0.85, "tolerance": 0.01}
    assert config["export"]["model_name"] == "churn"
