"""Config resolution and the atomic-output helpers (no TensorFlow needed)."""

import json
import os
import stat
import time

import pytest

from trainer import atomic, config as config_mod
from trainer.errors import BadInput


def test_resolve_fills_defaults_for_missing_sections(ws):
    raw = ws.config("train")
    del raw["evaluation"], raw["export"]
    del raw["training"]["optimizer"]
    resolved = config_mod.resolve(raw)
    assert resolved["training"]["optimizer"] == "adam"
    assert resolved["export"] == {"model_name": "model", "keep_versions": 5}
    assert resolved["data"]["image_size"] == [32, 32]
    assert config_mod.resolve(resolved) == resolved  # idempotent


@pytest.mark.parametrize("section, patch, words", [
    ("training", {"epochz": 3}, ["training", "epochz"]),
    ("training", {"epochs": "3"}, ["training.epochs", "integer"]),
    ("training", {"epochs": True}, ["training.epochs"]),
    ("training", {"optimizer": "adagrad"}, ["training.optimizer", "adam"]),
    ("data", {"format": "tsv"}, ["data.format", "csv"]),
    ("data", {"image_size": [32]}, ["data.image_size"]),
    ("data", {"features": [{"name": "f0", "type": "complex"}]}, ["data.features[0].type"]),
    ("data", {"classes": "cat,dog"}, ["data.classes", "at least two class names"]),
    ("data", {"classes": ["cat"]}, ["data.classes", "at least two class names"]),
    ("data", {"classes": ["cat", 1]}, ["data.classes[1]", "non-empty class name", "got 1"]),
    ("data", {"classes": ["cat", "dog "]}, ["data.classes[1]", "without leading or trailing spaces"]),
    ("data", {"classes": ["cat", "dog", "cat"]}, ["data.classes", "distinct names ('cat' repeated)"]),
    ("evaluation", {"metric": "roc"}, ["evaluation.metric", "accuracy"]),
    ("export", {"model_name": "../evil"}, ["export.model_name"]),
])
def test_resolve_rejects_bad_fields_naming_them(ws, section, patch, words):
    raw = ws.config("train")
    raw[section].update(patch)
    with pytest.raises(BadInput) as info:
        config_mod.resolve(raw)
    for word in words:
        assert word in str(info.value)


def test_resolve_rejects_a_broken_envelope(ws):
    raw = ws.config("train")
    del raw["paths"]["run_dir"]
    with pytest.raises(BadInput, match="paths.run_dir"):
        config_mod.resolve(raw)


def test_write_json_is_atomic_and_leaves_no_temp(tmp_path):
    path = str(tmp_path / "sub" / "x.json")
    atomic.write_json(path, {"a": 1})
    atomic.write_json(path, {"a": 2})
    assert json.load(open(path)) == {"a": 2}
    assert os.listdir(str(tmp_path / "sub")) == ["x.json"]
    with pytest.raises(ValueError):
        atomic.write_json(path, {"a": float("nan")})
    assert os.listdir(str(tmp_path / "sub")) == ["x.json"]
    assert json.load(open(path)) == {"a": 2}


def test_publish_dir_never_replaces(tmp_path):
    src = atomic.make_temp_dir(str(tmp_path))
    open(os.path.join(src, "f"), "w").close()
    (tmp_path / "1").mkdir()  # even an empty directory is not replaced
    with pytest.raises(FileExistsError):
        atomic.publish_dir(src, str(tmp_path / "1"))
    atomic.publish_dir(src, str(tmp_path / "2"))
    assert os.listdir(str(tmp_path / "2")) == ["f"]
    assert not os.path.exists(src)


def test_clean_stale_temps_only_removes_old_ones(tmp_path):
    old = atomic.make_temp_dir(str(tmp_path))
    new = atomic.make_temp_dir(str(tmp_path))
    (tmp_path / "3").mkdir()
    past = time.time() - 7200
    os.utime(old, (past, past))
    removed = atomic.clean_stale_temps(str(tmp_path))
    assert removed == [os.path.basename(old)]
    assert sorted(os.listdir(str(tmp_path))) == sorted(["3", os.path.basename(new)])


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_outputs_are_world_readable_whatever_the_umask(tmp_path):
    old = os.umask(0o077)  # mkstemp/mkdtemp give 0600/0700 anyway; open/mkdir obey the umask
    try:
        path = str(tmp_path / "run" / "x.json")
        atomic.write_json(path, {"a": 1})
        atomic.write_bytes(str(tmp_path / "run" / "plot.png"), b"\x89PNG")
        atomic.write_text(str(tmp_path / "run" / "report.html"), "<p>\u00e9</p>")
        tmp = atomic.make_temp_dir(str(tmp_path / "models"))
        assert mode(tmp) == 0o755
        os.makedirs(os.path.join(tmp, "variables"))
        with open(os.path.join(tmp, "variables", "data"), "w") as handle:  # as TF writes
            handle.write("x")
        atomic.publish_dir(tmp, str(tmp_path / "models" / "1"))
        replaced = atomic.make_temp_dir(str(tmp_path / "models"))
        open(os.path.join(replaced, "weights"), "w").close()
        atomic.replace_dir(replaced, str(tmp_path / "models" / "final"))
    finally:
        os.umask(old)
    for name in ("x.json", "plot.png", "report.html"):
        assert mode(str(tmp_path / "run" / name)) == 0o644, name
    assert open(str(tmp_path / "run" / "report.html"), encoding="utf-8").read() == "<p>\u00e9</p>"
    version = str(tmp_path / "models" / "1")
    assert mode(version) == mode(os.path.join(version, "variables")) == 0o755
    assert mode(os.path.join(version, "variables", "data")) == 0o644
    assert mode(str(tmp_path / "models" / "final")) == 0o755
    assert mode(str(tmp_path / "models" / "final" / "weights")) == 0o644
    assert sorted(os.listdir(str(tmp_path / "run"))) == ["plot.png", "report.html", "x.json"]
