"""Strict run parameters: unknown conf keys are named, with a did-you-mean (pure checks)."""

from __future__ import annotations

import pytest

from tfpipe.run_params import conf_only_keys, unknown_run_params

PARAMS = ("epochs", "batch_size", "learning_rate", "model", "optimizer", "seed", "mixed_precision",
          "warm_start", "gpus", "data_uri", "publish_uri")


@pytest.mark.parametrize("conf,expected", [
    ({"epoch": 3}, ["unknown run parameter 'epoch' (did you mean 'epochs'?)"]),
    ({"learningrate": 0.1, "epochs": 2}, ["unknown run parameter 'learningrate' (did you mean 'learning_rate'?)"]),
    ({"zzz": 1}, ["unknown run parameter 'zzz'"]),
    ({"batchsize": 8, "seeed": 1}, ["unknown run parameter 'batchsize' (did you mean 'batch_size'?)",
                                     "unknown run parameter 'seeed' (did you mean 'seed'?)"]),
    ({"epochs": 3, "gpus": "none"}, []),
    ({}, []),
    (None, []),
])
def test_unknown_keys_are_named_with_a_suggestion(conf, expected):
    assert unknown_run_params(conf, PARAMS) == expected


def test_a_bucket_param_the_dag_lacks_says_how_to_get_it():
    known = [p for p in PARAMS if p not in ("data_uri", "publish_uri")]
    assert unknown_run_params({"data_uri": "gs://b/raw", "publish_uri": "gs://b/m"}, known) == [
        "unknown run parameter 'data_uri' (this DAG has no stage_in task: give its PipelineConfig data_uri or "
        "gcs_tasks=True)",
        "unknown run parameter 'publish_uri' (this DAG has no publish task: give its PipelineConfig publish_uri or "
        "gcs_tasks=True)"]


def test_advanced_conf_only_overrides_stay_allowed():
    # checkpoint_every_steps is overridable from conf though it is not on the trigger form
    assert "checkpoint_every_steps" in conf_only_keys()
    assert unknown_run_params({"checkpoint_every_steps": 10}, set(PARAMS) | conf_only_keys()) == []
