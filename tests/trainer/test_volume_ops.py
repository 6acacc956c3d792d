"""The programs the provider's helper containers run (``python3 -m trainer.volume_ops``), in the image."""

import json
import os
import subprocess
import sys

from trainer import volume_ops


def _run(tmp_path, program, payload):
    """Run a program as the helper containers do: payload file in, result file out."""
    in_path, out_path = tmp_path / "in.json", tmp_path / "out.json"
    in_path.write_text(json.dumps(payload))
    proc = subprocess.run([sys.executable, "-m", "trainer.volume_ops", program, str(in_path), str(out_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out_path.read_text())


def test_list_dir_creates_the_target_and_reports_files_dirs_and_manifest(tmp_path):
    root = tmp_path / "vol" / "a" / "b"
    uid, gid = os.getuid(), os.getgid()
    payload = {"root": str(root), "uid": uid, "gid": gid, "manifest": ".m.json", "marker": ".m.json", "only": None}
    assert _run(tmp_path, "list_dir", payload) == {"files": {}, "dirs": [], "manifest": None}
    assert root.is_dir()
    (root / "sub").mkdir()
    (root / "sub" / "x.csv").write_text("1,2\n")
    (root / ".m.json").write_text(json.dumps({"objects": {"sub/x.csv": {}}}))
    result = _run(tmp_path, "list_dir", payload)
    assert result["files"] == {"sub/x.csv": 4}, "the manifest itself is not a data file"
    assert result["dirs"] == ["sub"]
    assert result["manifest"] == {"objects": {"sub/x.csv": {}}}
    only = _run(tmp_path, "list_dir", dict(payload, only=["sub/x.csv", "missing.csv"]))
    assert only["files"] == {"sub/x.csv": 4}


def test_list_dir_refuses_a_file_as_the_target(tmp_path):
    target = tmp_path / "digits.csv"
    target.write_text("x")
    payload = {"root": str(target), "uid": 0, "gid": 0, "manifest": "m", "marker": "m", "only": None}
    assert volume_ops.list_dir(payload) == {"error": "not_a_directory"}


def test_delete_files_removes_files_and_empty_dirs_but_never_leaves_the_root(tmp_path):
    root = tmp_path / "vol"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "gone.csv").write_text("x")
    (root / "keep.csv").write_text("x")
    outside = tmp_path / "outside.csv"
    outside.write_text("x")
    result = _run(tmp_path, "delete_files", {"root": str(root), "delete": ["a/b/gone.csv", "../outside.csv"]})
    assert result == {"removed": 1}
    assert not (root / "a").exists(), "directories left empty are removed"
    assert (root / "keep.csv").exists() and outside.exists()


def test_unknown_program_is_a_usage_error(tmp_path):
    assert volume_ops.main(["format_disk", "in", "out"]) == 2
