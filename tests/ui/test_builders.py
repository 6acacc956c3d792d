"""The pure pieces behind the plugin: URLs, the run note, metric gauges, lineage datasets (no engine)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tfpipe import lineage, metrics
from tfpipe.plugins import paths, summary

RUN_ID = "manual__2026-11-30T05:00:00+00:00"
VOLUMES = SimpleNamespace(data="/srv/data", work="/srv/work", models="/srv/models")


def test_report_and_tensorboard_urls_keep_the_run_id_one_path_segment():
    assert paths.report_url("dbg", RUN_ID, base="") == \
        "/tfpipe/runs/dbg/manual__2026-11-30T05%3A00%3A00%2B00%3A00/report/"
    assert paths.tensorboard_url("dbg", "r/1", base="https://af.example.org/") == \
        "https://af.example.org/tfpipe/runs/dbg/r%2F1/tensorboard/"


def test_location_record_round_trips_and_rejects_partial_records():
    record = paths.location_record(stage="train", docker_url="tcp://gpu:2376", image="img:1", volumes=VOLUMES)
    assert paths.parse_location(record) == {"stage": "train", "docker_url": "tcp://gpu:2376", "image": "img:1",
                                            "work": "/srv/work", "models": "/srv/models"}
    assert paths.parse_location({**record, "work": ""}) is None
    assert paths.parse_location("not a record") is None


EVALUATE = {"blessed": True, "metric": "accuracy", "value": 0.97123, "threshold": 0.9, "tolerance": 0.01,
            "baseline": {"version": 3, "value": 0.965}, "metrics": {"accuracy": 0.97123, "loss": 0.1}}


@pytest.mark.parametrize("results, tries, state, failed, expected", [
    ({"evaluate": EVALUATE, "export": {"model_name": "digits", "version": 4},
      "train": {"resumed_from": {"epoch": 1, "step": 110}}}, 2, "success", (),
     "tfpipe: blessed, accuracy 0.9712 >= threshold 0.9000 (baseline v3 0.9650); model digits v4; "
     "train 2 tries, resumed from step 110"),
    ({"evaluate": {**EVALUATE, "blessed": False, "value": 0.5, "baseline": None}, "train": {}}, 1, "success", (),
     "tfpipe: NOT blessed, accuracy 0.5000 < threshold 0.9000 (no baseline); no model exported; train 1 try"),
    ({}, 3, "failed", ("train",), "tfpipe: run failed at train; train 3 tries"),
    ({"evaluate": {**EVALUATE, "passed_over": [{"version": 5, "why": "trained on other classes"},
                                                {"version": 4, "why": "no accuracy in its metadata"}]},
      "export": {"model_name": "digits", "version": 6}, "train": {}}, 1, "success", (),
     "tfpipe: blessed, accuracy 0.9712 >= threshold 0.9000 (baseline v3 0.9650; passed over v5 v4); model digits "
     "v6; train 1 try"),
    ({"evaluate": {**EVALUATE, "baseline": None, "passed_over": [{"version": 2, "why": "trained on other classes"}]},
      "export": {"model_name": "digits", "version": 3}, "train": {}}, 1, "success", (),
     "tfpipe: blessed, accuracy 0.9712 >= threshold 0.9000 (no baseline; passed over v2); model digits v3; "
     "train 1 try"),
    # a sweep: the chosen trial with its settings, and how many of the trials finished
    ({"select": {"chosen": 2, "params": {"learning_rate": 0.005, "model_kwargs.hidden_units": [32]}, "trials": 4,
                 "finished": 3, "metric": "val_accuracy", "value": 0.96875},
      "evaluate": {**EVALUATE, "baseline": None}, "export": {"model_name": "digits", "version": 1}, "train": {}},
     2, "success", (),
     "tfpipe: trial 2 of 4 (3 finished) chosen: learning_rate=0.005, model_kwargs.hidden_units=[32], val_accuracy "
     "0.9688; blessed, accuracy 0.9712 >= threshold 0.9000 (no baseline); model digits v1; train 2 tries"),
])
def test_summary_line(results, tries, state, failed, expected):
    assert summary.summary_line(results, train_tries=tries, state=state, failed_tasks=failed) == expected


def test_summary_line_fits_the_note_column():
    line = summary.summary_line({}, train_tries=1, state="failed", failed_tasks=["t" * 400] * 5)
    assert len(line) == summary.NOTE_MAX and line.endswith("...")


def test_stage_gauges():
    assert metrics.stage_gauges("train", {"final_loss": 0.2, "epochs": 3, "steps": 90, "try_number": 2,
                                          "resumed_from": {"step": 30}, "final_dir": "/x"}) == \
        {"final_loss": 0.2, "epochs": 3.0, "steps": 90.0, "try_number": 2.0, "resumed": 1.0}
    assert metrics.stage_gauges("train", {"final_loss": 0.2, "final_accuracy": 0.9, "final_val_loss": 0.3,
                                          "final_val_accuracy": 0.85, "epochs": 3, "steps": 90, "try_number": 1}) == \
        {"final_loss": 0.2, "final_accuracy": 0.9, "final_val_loss": 0.3, "final_val_accuracy": 0.85,
         "epochs": 3.0, "steps": 90.0, "try_number": 1.0, "resumed": 0.0}
    assert metrics.stage_gauges("evaluate", {"metrics": {"accuracy": 0.9, "loss": float("nan")},
                                             "blessed": False}) == {"accuracy": 0.9, "blessed": 0.0}
    assert metrics.stage_gauges("export", {"version": 4}) == {"version": 4.0}
    assert metrics.stage_gauges("prep", {"examples": {"train": 10, "val": 3}}) == {"examples": 13.0}
    assert metrics.stage_gauges("train", None) == {"resumed": 0.0}


def test_lineage_namespaces_follow_openlineage_naming():
    assert lineage.file_namespace("unix://var/run/docker.sock") == "file"
    assert lineage.file_namespace("tcp://gpu-host-1:2376") == "file://gpu-host-1"
    assert lineage.gcs_dataset("gs://b/models/digits/4/") == lineage.LineageDataset("gs://b", "models/digits/4")


def test_stage_lineage_links_each_stage_to_the_next():
    prep = {"fingerprint": "abc123", "dataset_dir": "/work/datasets/abc123"}
    train = {"final_dir": "/work/runs/d/r/train/final", "final_loss": 0.1, "final_accuracy": 0.9}
    common = dict(volumes=VOLUMES, docker_url="unix://var/run/docker.sock", image="img:1", data_path="d/x.csv")
    p = lineage.stage_lineage("prep", result=prep, upstream={}, **common)
    assert p.inputs == (lineage.LineageDataset("file", "/srv/data/d/x.csv", {"tfpipe_fingerprint": {"fingerprint": "abc123"}}),)
    assert [d.name for d in p.outputs] == ["/srv/work/datasets/abc123"]
    t = lineage.stage_lineage("train", result=train, upstream={"prep": prep}, **common)
    assert [d.name for d in t.inputs] == ["/srv/work/datasets/abc123"]
    assert t.outputs[0].facets["tfpipe_metrics"] == {"metrics": {"loss": 0.1, "accuracy": 0.9}}
    e = lineage.stage_lineage("export", result={"model_dir": "/models/digits/2", "metrics": {"accuracy": 0.9}},
                              upstream={"train": train, "evaluate": EVALUATE}, **common)
    assert [d.name for d in e.inputs] == ["/srv/work/runs/d/r/train/final"]
    out = e.outputs[0]
    assert out.name == "/srv/models/digits/2" and out.facets["tfpipe_image"] == {"image": "img:1"}
    assert out.facets["tfpipe_blessing"]["blessed"] is True and out.facets["tfpipe_blessing"]["baseline_version"] == 3
    # before the stage ran (START) it names its inputs only
    assert lineage.stage_lineage("train", result=None, upstream={"prep": prep}, **common).outputs == ()


def test_each_stage_output_carries_its_facets():
    """The trained model carries metrics and the image (evaluate has not judged it yet); evaluation.json
    the metrics and the blessing; the exported model and its published copy metrics, blessing and image."""
    prep = {"fingerprint": "abc123", "dataset_dir": "/work/datasets/abc123"}
    train = {"final_dir": "/work/runs/d/r/train/final", "final_loss": 0.1, "final_accuracy": 0.9}
    evaluate = {**EVALUATE, "evaluation_path": "/work/runs/d/r/evaluation.json"}
    export = {"model_dir": "/models/digits/4", "version": 4, "metrics": {"accuracy": 0.97123}}
    common = dict(volumes=VOLUMES, docker_url="unix://var/run/docker.sock", image="img:1", data_path="d/x.csv")
    blessing = {"blessed": True, "metric": "accuracy", "value": 0.97123, "threshold": 0.9, "tolerance": 0.01,
                "reason": None, "baseline_version": 3, "baseline_value": 0.965}

    (trained,) = lineage.stage_lineage("train", result=train, upstream={"prep": prep}, **common).outputs
    assert trained.facets == {"tfpipe_metrics": {"metrics": {"loss": 0.1, "accuracy": 0.9}},
                              "tfpipe_image": {"image": "img:1"}}
    judged = lineage.stage_lineage("evaluate", result=evaluate, upstream={"prep": prep, "train": train}, **common)
    assert [d.name for d in judged.inputs] == ["/srv/work/runs/d/r/train/final", "/srv/work/datasets/abc123"]
    (report,) = judged.outputs
    assert report.name == "/srv/work/runs/d/r/evaluation.json"
    assert report.facets == {"tfpipe_metrics": {"metrics": {"accuracy": 0.97123, "loss": 0.1}},
                             "tfpipe_blessing": blessing}
    model = {"tfpipe_metrics": {"metrics": {"accuracy": 0.97123}}, "tfpipe_blessing": blessing,
             "tfpipe_image": {"image": "img:1"}}
    (exported,) = lineage.stage_lineage("export", result=export, upstream={"train": train, "evaluate": evaluate},
                                        **common).outputs
    assert exported.facets == model
    (published,) = lineage.publish_lineage(
        models_volume="/srv/models", model_name="digits", docker_url=common["docker_url"], image="img:1",
        result={"uri": "gs://b/models/digits/4"}, export=export, evaluation=evaluate).outputs
    assert (published.namespace, published.name, published.facets) == ("gs://b", "models/digits/4", model)
    # the image facet names the image the task ran; without one it is left out, not empty
    (bare,) = lineage.stage_lineage("train", result=train, upstream={}, **{**common, "image": None}).outputs
    assert "tfpipe_image" not in bare.facets


def test_a_sweep_s_lineage_names_the_chosen_trial_on_select_s_output_and_the_exported_model():
    """select's output is the run's final weights with the chosen trial (index, settings, metric, value, of how
    many); evaluate and export read those weights, and the exported model names the trial too."""
    prep = {"fingerprint": "abc123", "dataset_dir": "/work/datasets/abc123"}
    select = {"chosen": 2, "params": {"learning_rate": 0.005}, "metric": "val_accuracy", "value": 0.97, "trials": 4,
              "finished": 4, "final_dir": "/work/runs/d/r/train/final"}
    trial = {"trial": 2, "params": {"learning_rate": 0.005}, "metric": "val_accuracy", "value": 0.97, "trials": 4}
    common = dict(volumes=VOLUMES, docker_url="unix://var/run/docker.sock", image="img:1", data_path="d/x.csv")
    (chosen,) = lineage.stage_lineage("select", result=select, upstream={"prep": prep}, **common).outputs
    assert chosen.name == "/srv/work/runs/d/r/train/final" and chosen.facets == {"tfpipe_trial": trial}
    judged = lineage.stage_lineage("evaluate", result=EVALUATE, upstream={"prep": prep, "train": None,
                                                                          "select": select}, **common)
    assert [d.name for d in judged.inputs] == ["/srv/work/runs/d/r/train/final", "/srv/work/datasets/abc123"]
    (exported,) = lineage.stage_lineage("export", result={"model_dir": "/models/digits/1"},
                                        upstream={"select": select, "evaluate": EVALUATE}, **common).outputs
    assert exported.facets["tfpipe_trial"] == trial


def test_a_note_a_person_wrote_is_kept():
    from tfpipe.plugins.listener import write_note

    run = SimpleNamespace(note="ops: rerun after the disk filled", dag_id="d", run_id="r")
    write_note(run, session=None)  # returns before it reads anything
    assert run.note == "ops: rerun after the disk filled"


def test_tensorboard_s_root_relative_fonts_are_made_relative_to_the_page():
    from tfpipe.plugins.app import fonts_under_route

    css = b"src: local('Roboto'), url(/font-roboto/abc.woff2) format('woff2'); url(/data/x)"
    # the page itself (the route's "" path) and a page one folder down
    assert fonts_under_route(css, "") == css.replace(b"url(/font-roboto/", b"url(font-roboto/")
    assert fonts_under_route(css, "font-roboto/roboto.html") == css.replace(b"url(/font-roboto/",
                                                                            b"url(../font-roboto/")
