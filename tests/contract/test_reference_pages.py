"""The reference pages under docs/reference are generated from the code (scripts/gen_reference.py)
and committed: they must be what the generator writes now, and name every config field with its
default, every exit code and every run parameter."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from tfpipe import contract
from tfpipe.config import PipelineConfig
from tfpipe.run_params import conf_only_keys

REPO = Path(__file__).resolve().parent.parent.parent
REFERENCE = REPO / "docs" / "reference"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "scripts" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tables(page: str) -> dict[str, dict[str, list[str]]]:
    """``{heading: {first cell without backticks: cells}}`` of every table row under each ``##`` heading."""
    tables: dict[str, dict[str, list[str]]] = {}
    rows: dict[str, list[str]] = {}
    for line in page.splitlines():
        if line.startswith("## "):
            rows = tables.setdefault(line[3:].strip(), {})
        elif line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return tables


def test_committed_reference_pages_are_the_generated_ones():
    """The staleness check: a change to the config models, the contract or the Params without
    regenerating the pages fails here."""
    for path, text in _generator().render().items():
        assert path.exists(), f"{path.relative_to(REPO)} is missing: run python scripts/gen_reference.py"
        assert path.read_text() == text, f"{path.relative_to(REPO)} is stale: run python scripts/gen_reference.py"


def test_check_mode_fails_naming_a_stale_page_and_passes_on_fresh_ones(tmp_path, monkeypatch, capsys):
    generator = _generator()
    monkeypatch.setattr(generator, "REFERENCE", tmp_path)
    assert generator.main([]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configuration.md", "exit-codes.md", "params.md"]
    assert generator.main(["--check"]) == 0
    (tmp_path / "params.md").write_text("# Run parameters\n\nedited by hand\n")
    capsys.readouterr()
    assert generator.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "params.md is stale" in err and "configuration.md" not in err
    assert (tmp_path / "params.md").read_text() == "# Run parameters\n\nedited by hand\n", "--check writes nothing"


SECTIONS = {name: info.annotation for name, info in PipelineConfig.model_fields.items()
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)}


@pytest.mark.parametrize("heading,model", [("Pipeline", PipelineConfig), *SECTIONS.items()],
                         ids=["pipeline", *SECTIONS])
def test_every_config_field_is_in_the_configuration_reference_with_its_default(heading, model):
    rows = _tables((REFERENCE / "configuration.md").read_text())[heading]
    assert list(rows) == list(model.model_fields), "one row per field, in the model's order"
    for name, info in model.model_fields.items():
        default = rows[name][2]
        if info.is_required():
            assert default == "required", name
        elif model is PipelineConfig and name in SECTIONS:
            assert rows[name][1] == f"[{name}](#{name})", name
        else:
            value = to_jsonable_python(info.get_default(call_default_factory=True))
            assert default == f"`{json.dumps(value)}`", name
        assert rows[name][4], f"{heading}.{name} has no meaning"
    section = model.section if model is not PipelineConfig else ""
    for name, spec in contract.SECTIONS.get(section, {}).items():
        assert rows[name][2] == f"`{json.dumps(spec['default'])}`", f"{section}.{name}: the contract's default"


def test_the_exit_code_reference_lists_every_code_whether_it_is_retried_and_its_fix():
    rows = _tables("## codes\n" + (REFERENCE / "exit-codes.md").read_text())["codes"]
    codes = {name: value for name, value in vars(contract.ExitCode).items() if isinstance(value, int)}
    for name, value in codes.items():
        cells = rows[str(value)]
        assert cells[1] == f"`{name}`"
        assert cells[3] == "no" if value in contract.ExitCode.NO_RETRY else cells[3] in ("yes", "—"), name
        assert (cells[4] != "—") == bool(contract.ExitCode.FIXES.get(value)), name
    assert rows["137"][3] == "yes" and rows["11"][3] == "no"


def test_the_params_reference_lists_every_form_param_and_every_conf_only_override():
    from tfpipe.dag_factory import pipeline_params

    cfg = PipelineConfig(dag_id="p", image={}, data={"path": "x.csv"}, gcs_tasks=True,
                         volumes={"data": "/srv/d", "work": "/srv/w", "models": "/srv/m"})
    tables = _tables("## form\n" + (REFERENCE / "params.md").read_text())
    params = pipeline_params(cfg)
    assert list(tables["form"]) == list(params)
    assert set(tables["Overrides in the run's conf only"]) == conf_only_keys() - set(params)
