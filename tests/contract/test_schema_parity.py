"""One schema for the stage config: the provider's models, its trigger-form Params and the
trainer's config resolution all read ``contract.SECTIONS``; these tests fail on any drift.

The trainer's ``config`` module is standard library only, so the host imports it directly.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tfpipe import contract
from tfpipe.config import STAGE_SECTIONS, PipelineConfig
from tfpipe.dag_factory import pipeline_params
from tfpipe.exceptions import TfpipeConfigError
from tfpipe.specs import apply_overrides, config_template, resolve_stage_config
from trainer import config as trainer_config
from trainer import contract as trainer_contract
from trainer.errors import BadInput

REPO = Path(__file__).resolve().parent.parent.parent
GOOD = {
    "dag_id": "parity",
    "image": {"ref": "tfpipe/trainer:0.1.0"},
    "volumes": {"data": "/srv/p/data", "work": "/srv/p/work", "models": "/srv/p/models"},
    "data": {"path": "digits/digits.csv"},
}
FIELDS = [(section, name) for section, fields in contract.SECTIONS.items() for name in fields]


def _provider_section(section: str, **values):
    base = {"path": "x.csv"} if section == "data" else {}
    return STAGE_SECTIONS[section].from_dict({**base, **values})


def _trainer_resolve(section: str, **values) -> dict:
    template = config_template(PipelineConfig.from_dict(GOOD), "train")
    template[section] = {**({"path": "x.csv"} if section == "data" else {}), **values}
    config = resolve_stage_config(template, dag_id="d", run_id="r", task_id="train", try_number=1, image="i")
    return trainer_config.resolve(config)[section]


def test_both_wings_read_the_same_file():
    assert Path(contract.__file__).resolve() == Path(trainer_contract.__file__).resolve()


def test_provider_sections_have_exactly_the_contract_fields():
    for section, kind in STAGE_SECTIONS.items():
        assert list(kind.model_fields) == list(contract.SECTIONS[section]), section


DEFAULTED = [(s, n) for s, n in FIELDS if (s, n) != ("data", "path")]


@pytest.mark.parametrize("section,name", DEFAULTED, ids=[f"{s}.{n}" for s, n in DEFAULTED])
def test_defaults_agree_on_both_sides(section, name):
    expected = contract.SECTIONS[section][name]["default"]
    provider = _provider_section(section).to_dict()[name]
    trainer = _trainer_resolve(section)[name]
    assert provider == expected == trainer


def test_data_path_defaults_to_none_which_a_pipeline_must_replace():
    assert contract.SECTIONS["data"]["path"]["default"] is None
    assert STAGE_SECTIONS["data"].model_fields["path"].default is None
    with pytest.raises(TfpipeConfigError, match="data.path.*Fix:"):
        STAGE_SECTIONS["data"].from_dict({})
    template = config_template(PipelineConfig.from_dict(GOOD), "prep")
    del template["data"]["path"]
    config = resolve_stage_config(template, dag_id="d", run_id="r", task_id="prep", try_number=1, image="i")
    assert trainer_config.resolve(config)["data"]["path"] is None


def test_a_provider_config_resolves_unchanged_in_the_trainer():
    cfg = PipelineConfig.from_dict({**GOOD, "evaluation": {"metric": "macro_f1", "threshold": 0.5}})
    config = resolve_stage_config(config_template(cfg, "evaluate"), dag_id="d", run_id="r", task_id="evaluate",
                                  try_number=1, image="i")
    resolved = trainer_config.resolve(config)
    for section in contract.SECTIONS:
        assert resolved[section] == config[section], section


BOUNDED = [(s, n) for s, n in FIELDS if contract.SECTIONS[s][n]["kind"] in ("int", "number")
           and {"minimum", "exclusive_minimum", "maximum", "exclusive_maximum"} & set(contract.SECTIONS[s][n])]


@pytest.mark.parametrize("section,name", BOUNDED, ids=[f"{s}.{n}" for s, n in BOUNDED])
def test_hard_bounds_are_enforced_on_both_sides(section, name):
    spec = contract.SECTIONS[section][name]
    step = 1 if spec["kind"] == "int" else 1e-6
    outside, inside = [], []
    if "minimum" in spec:
        outside.append(spec["minimum"] - step)
        inside.append(spec["minimum"])
    if "exclusive_minimum" in spec:
        outside.append(spec["exclusive_minimum"])
        inside.append(spec["exclusive_minimum"] + step)
    if "maximum" in spec:
        outside.append(spec["maximum"] + step)
        inside.append(spec["maximum"])
    if "exclusive_maximum" in spec:
        outside.append(spec["exclusive_maximum"])
        inside.append(spec["exclusive_maximum"] - step)
    for value in outside:
        with pytest.raises(TfpipeConfigError, match=f"{section}.{name}.*Fix:"):
            _provider_section(section, **{name: value})
        with pytest.raises(BadInput, match=f"{section}.{name}"):
            _trainer_resolve(section, **{name: value})
    for value in inside:
        assert _provider_section(section, **{name: value}).to_dict()[name] == value
        assert _trainer_resolve(section, **{name: value})[name] == value


PLAUSIBLE = [(s, n) for s, n in FIELDS if "parse_maximum" in contract.SECTIONS[s][n]]


@pytest.mark.parametrize("section,name", PLAUSIBLE, ids=[f"{s}.{n}" for s, n in PLAUSIBLE])
def test_plausibility_bounds_are_checked_at_parse_time_and_in_the_form_only(section, name):
    spec = contract.SECTIONS[section][name]
    above = spec["parse_maximum"] + (1 if spec["kind"] == "int" else 0.01)
    with pytest.raises(TfpipeConfigError, match=f"{section}.{name}.*Fix:"):
        _provider_section(section, **{name: above})
    assert _trainer_resolve(section, **{name: above})[name] == above, "the trainer still runs with it"
    params = pipeline_params(PipelineConfig.from_dict(GOOD))
    if name in params:
        assert params[name].schema["maximum"] == spec["parse_maximum"]


CHOICES = [(s, n) for s, n in FIELDS if "choices" in contract.SECTIONS[s][n]]


@pytest.mark.parametrize("section,name", CHOICES, ids=[f"{s}.{n}" for s, n in CHOICES])
def test_every_choice_is_accepted_on_both_sides_and_nothing_else(section, name):
    for choice in contract.SECTIONS[section][name]["choices"]:
        assert _provider_section(section, **{name: choice}).to_dict()[name] == choice
        assert _trainer_resolve(section, **{name: choice})[name] == choice
    with pytest.raises(TfpipeConfigError, match=f"{section}.{name}.*Fix:"):
        _provider_section(section, **{name: "not-a-choice"})
    with pytest.raises(BadInput, match=f"{section}.{name}"):
        _trainer_resolve(section, **{name: "not-a-choice"})



@pytest.mark.parametrize("old", [True, False])
def test_training_cache_of_old_dags_as_a_boolean_is_an_error_naming_the_choices(old):
    """``training.cache`` was a boolean: a DAG still saying ``true``/``false`` gets an error that names
    the field and the four choices, not a silent mapping to one of them."""
    choices = contract.SECTIONS["training"]["cache"]["choices"]
    assert len(choices) == 4
    with pytest.raises(TfpipeConfigError, match="training.cache") as err:
        _provider_section("training", cache=old)
    assert all(repr(choice) in str(err.value) or choice in str(err.value) for choice in choices), str(err.value)
    assert "Fix:" in str(err.value)

def test_every_gate_metric_is_selectable_in_a_dag_and_in_the_trigger_form():
    params = pipeline_params(PipelineConfig.from_dict(GOOD))
    assert params["metric"].schema["enum"] == list(contract.METRICS)
    assert "macro_f1" in contract.METRICS
    template = config_template(PipelineConfig.from_dict(GOOD), "evaluate")
    for metric in contract.METRICS:
        cfg = PipelineConfig.from_dict({**GOOD, "evaluation": {"metric": metric}})
        assert cfg.evaluation.metric == metric
        assert apply_overrides(template, {"metric": metric, "threshold": 0.7})["evaluation"] == {
            **contract.section_defaults("evaluation"), "metric": metric, "threshold": 0.7}


def test_form_params_take_type_bounds_and_choices_from_the_contract():
    params = pipeline_params(PipelineConfig.from_dict(GOOD))
    kinds = {"int": "integer", "number": "number", "bool": "boolean", "str": "string"}
    for name, section in contract.overridable(("param",)).items():
        spec, schema = contract.SECTIONS[section][name], params[name].schema
        assert schema["type"] == kinds[spec["kind"]], name
        for key, json_key in (("minimum", "minimum"), ("exclusive_minimum", "exclusiveMinimum")):
            assert schema.get(json_key) == spec.get(key), name
        if "choices" in spec:
            assert schema["enum"] == list(spec["choices"]), name


def test_no_stage_config_default_is_written_outside_the_contract():
    """Neither reader declares a stage-config field itself (the drift this removed): the provider's
    section models get every field, with its default, bounds and choices, from the contract."""
    provider = ast.parse((REPO / "provider" / "tfpipe" / "config.py").read_text())
    names = {kind.__name__: section for section, kind in STAGE_SECTIONS.items()}
    for node in ast.walk(provider):
        if isinstance(node, ast.ClassDef) and node.name in names:
            fields = contract.SECTIONS[names[node.name]]
            declared = [item.target.id for item in node.body if isinstance(item, ast.AnnAssign)
                        and isinstance(item.target, ast.Name) and item.target.id in fields]
            assert declared == [], f"{node.name} declares {declared} itself"
    for section, kind in STAGE_SECTIONS.items():
        for name, spec in contract.SECTIONS[section].items():
            assert kind.model_fields[name].description == spec["doc"], f"{section}.{name}"
    trainer_source = (REPO / "trainer" / "config.py").read_text()
    for section, fields in contract.SECTIONS.items():
        for name in fields:
            assert f'"{name}": (' not in trainer_source, f"trainer/config.py declares {section}.{name} itself"
