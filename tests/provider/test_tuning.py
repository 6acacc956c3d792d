"""Sweeps on the Airflow side: the ``tuning`` section's checks, the trials it plans, the mapped DAG shape,
and a trial's train config."""

from __future__ import annotations

import copy
import itertools
import math
from types import SimpleNamespace

import pytest

from tfpipe import contract
from tfpipe.compat import DagBag
from tfpipe.config import PipelineConfig, TuningConfig
from tfpipe.dag_factory import training_pipeline
from tfpipe.exceptions import TfpipeConfigError
from tfpipe.operators.docker import put_trial, trial_label
from tfpipe.specs import plan_pipeline
from tfpipe.tries import resolve_try

from .test_config import GOOD

SPACE = {"learning_rate": {"low": 0.0003, "high": 0.01, "log": True}, "model_kwargs.hidden_units": [[32], [64, 32]]}


def _cfg(tuning=None, **overrides) -> PipelineConfig:
    return PipelineConfig.from_dict({**copy.deepcopy(GOOD), "tuning": tuning, **overrides})


def test_without_a_space_there_is_one_train_task_and_no_select():
    """The default pipeline is not a sweep: no mapped train, no select stage, and no trial in the config."""
    cfg = _cfg()
    assert not cfg.tuning.enabled and cfg.tuning.trial_plan() == []
    assert [s.stage for s in plan_pipeline(cfg)] == list(contract.STAGES)
    dag = training_pipeline(cfg)
    assert "select" not in dag.task_ids and type(dag.get_task("train")).__name__ == "TrainOperator"


def test_a_sweep_maps_train_over_its_trials_at_most_parallel_at_once_in_the_gpu_pool_then_selects():
    """train becomes one mapped instance per trial, held to ``tuning.parallel`` per run and to the GPU pool;
    select runs after every trial is done (a failed trial does not stop the others' selection) and
    evaluate reads what select chose."""
    cfg = _cfg({"space": SPACE, "trials": 4, "parallel": 2}, gpu_pool="gpu")
    assert [s.stage for s in plan_pipeline(cfg)] == ["prep", "validate", "train", "select", "evaluate", "export"]
    dag = training_pipeline(cfg)
    train, select, evaluate = (dag.get_task(t) for t in ("train", "select", "evaluate"))
    assert type(train).__name__ == "MappedOperator"
    assert train.expand_input.value == {"trial": cfg.tuning.trial_plan()}
    assert [t["index"] for t in train.expand_input.value["trial"]] == [0, 1, 2, 3]
    assert train.partial_kwargs["max_active_tis_per_dagrun"] == 2
    assert train.partial_kwargs["pool"] == "gpu"
    assert train.partial_kwargs["retries"] == cfg.retries, "each trial is retried on its own, as train is"
    assert select.upstream_task_ids == {"train"} and evaluate.upstream_task_ids == {"select"}
    assert select.trigger_rule in ("all_done_min_one_success", "all_done")
    assert select.spec.config[contract.TRIALS_KEY] == cfg.tuning.trial_plan(), "select knows every trial"
    assert "4 mapped trials" in dag.doc_md and "val_accuracy" in dag.doc_md


def test_a_grid_is_every_combination_in_the_order_the_space_lists_them():
    """``search: grid`` runs the product of the listed values (``trials`` does not cut it)."""
    space = {"learning_rate": [0.001, 0.01, 0.1], "optimizer": ["adam", "sgd"]}
    plan = TuningConfig(space=space, search="grid", trials=1).trial_plan()
    assert [t["params"] for t in plan] == [dict(zip(space, combo)) for combo in itertools.product(*space.values())]
    assert [t["index"] for t in plan] == list(range(6))


def test_a_random_search_is_seeded_and_draws_inside_each_range():
    """The same seed plans the same trials (a re-parse never changes a sweep); a log range stays within its
    ends, an integer range gives whole numbers, and a list gives one of its values."""
    space = {**SPACE, "epochs": {"low": 2, "high": 9}}
    first = TuningConfig(space=space, trials=30, seed=5).trial_plan()
    assert first == TuningConfig(space=space, trials=30, seed=5).trial_plan()
    assert first != TuningConfig(space=space, trials=30, seed=6).trial_plan()
    rates = [t["params"]["learning_rate"] for t in first]
    assert all(0.0003 <= r <= 0.01 for r in rates)
    # log-uniform: about as many draws below the range's geometric middle as above it
    middle = math.sqrt(0.0003 * 0.01)
    assert 8 <= sum(r < middle for r in rates) <= 22, rates
    assert all(isinstance(t["params"]["epochs"], int) and 2 <= t["params"]["epochs"] <= 9 for t in first)
    assert {tuple(t["params"]["model_kwargs.hidden_units"]) for t in first} == {(32,), (64, 32)}


@pytest.mark.parametrize("tuning, words", [
    ({"space": {"learnin_rate": [0.01]}}, ["tuning.space.learnin_rate", "unknown training setting",
                                           "did you mean 'learning_rate'", "Fix:"]),
    ({"space": {"code_path": ["/x"]}}, ["tuning.space.code_path", "unknown training setting", "Fix:"]),
    ({"space": {"model_kwargs.": [1]}}, ["tuning.space.model_kwargs.", "Fix:"]),
    ({"space": {"learning_rate": []}}, ["tuning.space.learning_rate", "empty list", "Fix:"]),
    ({"space": {"learning_rate": 0.01}}, ["tuning.space.learning_rate", "list of values or a range", "Fix:"]),
    ({"space": {"learning_rate": {"low": 0.1, "high": 0.01}}}, ["tuning.space.learning_rate", "low < high"]),
    ({"space": {"learning_rate": {"low": 0.0, "high": 0.1, "log": True}}}, ["tuning.space.learning_rate.log",
                                                                          "low above 0"]),
    ({"space": {"learning_rate": {"low": 0.01, "high": 0.1, "step": 2}}}, ["tuning.space.learning_rate.step",
                                                                         "unknown key"]),
    ({"space": {"epochs": {"low": 1.5, "high": 4}}}, ["tuning.space.epochs", "whole number", "Fix:"]),
    ({"space": {"optimizer": {"low": 1, "high": 2}}}, ["tuning.space.optimizer", "no range", "Fix: list its values"]),
    ({"space": {"learning_rate": {"low": 0.001, "high": 0.1}}, "search": "grid"},
     ["tuning.space.learning_rate", "grid search takes lists", "Fix:"]),
    ({"space": {"batch_size": list(range(1, 40)), "epochs": list(range(1, 40))}, "search": "grid"},
     ["tuning.space", "1521 combinations", "Fix:"]),
    ({"space": SPACE, "trials": 0}, ["tuning.trials", ">= 1", "Fix:"]),
    ({"space": SPACE, "parallel": 0}, ["tuning.parallel", ">= 1", "Fix:"]),
    ({"space": SPACE, "search": "bayes"}, ["tuning.search", "'grid'", "'random'"]),
    ({"space": SPACE, "metric": "auc"}, ["tuning.metric", "val_accuracy"]),
    ({"spaces": SPACE}, ["tuning.spaces", "did you mean 'space'"]),
])
def test_a_bad_search_space_is_refused_when_the_dag_is_parsed(tuning, words):
    with pytest.raises(TfpipeConfigError) as err:
        training_pipeline(_cfg(tuning))
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("tuning, words", [
    # a value that can never train, whether or not a random draw picks it
    ({"space": {"learning_rate": [0.01, -1.0]}, "trials": 1},
     ["tuning.space.learning_rate", "the value -1.0", "training.learning_rate", "Fix:"]),
    ({"space": {"optimizer": ["adam", "adm"]}, "trials": 1},
     ["tuning.space.optimizer", "'adm'", "training.optimizer", "Fix: use one of"]),
    ({"space": {"batch_size": {"low": 0, "high": 64}}}, ["tuning.space.batch_size", "the value 0",
                                                        "training.batch_size", "Fix:"]),
    # settings that are each fine but not together
    ({"space": {"epochs": [2, 4], "learning_rate_warmup_epochs": [1, 2]}, "search": "grid"},
     ["tuning.space: trial 1 (epochs=2, learning_rate_warmup_epochs=2)", "training.learning_rate_warmup_epochs",
      "Fix:"]),
])
def test_a_trial_whose_settings_are_invalid_fails_the_parse_naming_the_field(tuning, words):
    with pytest.raises(TfpipeConfigError) as err:
        _cfg(tuning)
    for word in words:
        assert word in str(err.value)


def test_a_dag_file_with_an_invalid_trial_is_an_import_error_naming_the_field(tmp_path):
    """What the Airflow UI shows: the DAG file's import error names the setting and its bad value."""
    (tmp_path / "bad_sweep.py").write_text(f'''
import airflow.providers.tfpipe  # noqa: F401  (Airflow's safe mode parses files that name airflow)
from tfpipe import PipelineConfig, training_pipeline
dag = training_pipeline(PipelineConfig.from_dict({{**{GOOD!r}, "dag_id": "bad_sweep",
    "tuning": {{"space": {{"learning_rate": [0.01, 20.0]}}}}}}))
''')
    errors = DagBag(dag_folder=str(tmp_path)).import_errors
    (message,) = errors.values()
    assert "tuning.space.learning_rate" in message and "20.0" in message and "Fix:" in message


def test_sweeps_are_refused_on_kubernetes_naming_the_backend():
    with pytest.raises(TfpipeConfigError, match=r"tuning.space: sweeps need the Docker backend.*Fix:"):
        _cfg({"space": SPACE}, backend="kubernetes", kubernetes={"claims": {"work": "w", "models": "m"}})


def test_a_trial_s_train_config_takes_its_settings_over_the_run_s_and_names_the_trial():
    """A run's Params reach every trial, but a tuned setting is the trial's; model_kwargs are merged key by
    key; the trainer gets the trial key it keeps its state under."""
    cfg = _cfg({"space": SPACE}, training={"model": "mlp", "model_kwargs": {"dropout": 0.1}})
    spec = next(s for s in plan_pipeline(cfg) if s.stage == "train")
    ti = SimpleNamespace(dag_id="digits", run_id="manual__1", task_id="train", try_number=1, map_index=1)
    plan = resolve_try(spec, ti, {"learning_rate": 0.5, "epochs": 3})
    trial = {"index": 1, "params": {"learning_rate": 0.002, "model_kwargs.hidden_units": [32]}}
    put_trial(plan.config, trial)
    assert plan.config["training"]["learning_rate"] == 0.002 and plan.config["training"]["epochs"] == 3
    assert plan.config["training"]["model_kwargs"] == {"dropout": 0.1, "hidden_units": [32]}
    assert plan.config[contract.TRIAL_KEY] == trial
    assert trial_label(trial) == "trial 1: learning_rate=0.002, model_kwargs.hidden_units=[32]"
    # a run override that makes a trial impossible is named when the trial runs
    plan = resolve_try(spec, ti, {"epochs": 2})
    with pytest.raises(TfpipeConfigError, match="training.learning_rate_warmup_epochs"):
        put_trial(plan.config, {"index": 0, "params": {"learning_rate_warmup_epochs": 2}})


def test_the_example_sweep_plans_the_trials_the_sweeps_page_shows():
    """docs: sweeps: the example DAG ``tfpipe_digits_sweep`` is a 4-trial random sweep, 2 at a time, and its
    trial 1 is the one the page names in the grid view."""
    import runpy

    from tests.conftest import REPO

    dag = runpy.run_path(str(REPO / "dags" / "tfpipe_digits_sweep.py"))["dag"]
    train = dag.get_task("train")
    trials = train.expand_input.value["trial"]
    assert len(trials) == 4 and train.partial_kwargs["max_active_tis_per_dagrun"] == 2
    label = trial_label(trials[1])
    assert label == "trial 1: learning_rate=0.0004136, model_kwargs.hidden_units=[64, 32]"
    assert label in (REPO / "docs" / "sweeps.md").read_text().replace("\n", " ")
