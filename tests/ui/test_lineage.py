"""OpenLineage events of a real run (file transport) hold the chain from gs:// raw data to the published model."""

from __future__ import annotations

import json

import pytest

from tests.ui.conftest import DAG_ID

pytestmark = pytest.mark.integration


def _key(dataset: dict) -> tuple[str, str]:
    return dataset["namespace"], dataset["name"]


def test_lineage_chain_from_raw_data_to_the_published_model(ui_run):
    events = [json.loads(line) for line in ui_run["lineage"].read_text().splitlines() if line.strip()]
    complete = {e["job"]["name"].split(".", 1)[1]: e for e in events
                if e["eventType"] == "COMPLETE" and e["job"]["name"].startswith(f"{DAG_ID}.")}
    assert {"stage_in", "prep", "validate", "train", "evaluate", "export", "publish"} <= set(complete), sorted(complete)
    io = {task: ([_key(d) for d in e["inputs"]], [_key(d) for d in e["outputs"]]) for task, e in complete.items()}
    home, bucket = ui_run["home"], ui_run["bucket"]
    raw = ("file", str(home / "data" / "digits" / "digits.csv"))

    assert io["stage_in"] == ([(f"gs://{bucket}", "raw/digits.csv")], [raw])
    assert io["prep"][0] == [raw]
    (dataset,) = io["prep"][1]
    assert dataset[1].startswith(str(home / "work" / "datasets") + "/")
    assert io["train"][0] == [dataset]
    # the data gate read the data set: OpenLineage's data-quality input facets on it (the first night
    # has no baseline, so its checks are against the config: none failed)
    assert io["validate"] == ([dataset], [])
    quality = complete["validate"]["inputs"][0]["inputFacets"]
    assert quality["dataQualityMetrics"]["rowCount"] == 1797  # the digits, train and eval
    assert "pixel_20" in quality["dataQualityMetrics"]["columnMetrics"]
    assert all(a["success"] for a in quality["dataQualityAssertions"]["assertions"])
    (trained,) = io["train"][1]
    assert trained[1].endswith("/train/final")
    assert trained in io["evaluate"][0] and dataset in io["evaluate"][0]
    assert io["export"][0] == [trained]
    model = ("file", str(home / "models" / DAG_ID / "1"))
    assert io["export"][1] == [model]
    assert io["publish"] == ([model], [(f"gs://{bucket}", f"models/{DAG_ID}/1")])

    # the facts on the way: the data fingerprint, and metrics, blessing and image on the model
    fingerprint = complete["prep"]["inputs"][0]["facets"]["tfpipe_fingerprint"]["fingerprint"]
    assert dataset[1].endswith(fingerprint) and len(fingerprint) >= 12
    assert complete["prep"]["outputs"][0]["facets"]["tfpipe_fingerprint"]["fingerprint"] == fingerprint
    for task in ("export", "publish"):
        facets = complete[task]["outputs"][0]["facets"]
        assert facets["tfpipe_metrics"]["metrics"]["accuracy"] == pytest.approx(
            ui_run["summary"]["metrics"]["accuracy"])
        assert facets["tfpipe_blessing"]["blessed"] is True and facets["tfpipe_blessing"]["threshold"] == 0.5
        assert facets["tfpipe_image"]["image"] == ui_run["image"]
    # every task of the run is one job of the same DAG run (its parent run facet)
    parents = {e["run"]["facets"]["parent"]["run"]["runId"] for e in complete.values()}
    assert len(parents) == 1


def test_a_sweep_s_trial_facet_becomes_an_openlineage_dataset_facet():
    """The chosen trial reaches OpenLineage as the ``tfpipe_trial`` facet, with its settings, on the model."""
    from tfpipe import lineage

    trial = {"trial": 2, "params": {"learning_rate": 0.005}, "metric": "val_accuracy", "value": 0.97, "trials": 4}
    model = lineage.LineageDataset("file", "/srv/models/digits/1", {"tfpipe_trial": trial})
    (converted,) = lineage.to_operator_lineage(lineage.StageLineage((), (model,))).outputs
    facet = converted.facets["tfpipe_trial"]
    assert (facet.trial, facet.params, facet.metric, facet.value, facet.trials) == (2, {"learning_rate": 0.005},
                                                                                    "val_accuracy", 0.97, 4)
    assert facet._get_schema().endswith("#tfpipe_trial")
