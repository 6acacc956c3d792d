"""Seeing and reproducing a real run: its extra links, TensorBoard, the report in Chromium, the shell.

One DAG run through Airflow (`tfpipe run`, real containers) is shared by the module. While it runs,
a watcher records `docker inspect` of every stage container, so the shell can be compared with
the container the task really had.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
import zlib
from pathlib import Path

import pytest

from tests.conftest import DIGITS_CSV, REPO, chromium_path, dag_command, free_port, run_dag, write_dag
from tfpipe import contract
from tfpipe import links as run_links

pytestmark = pytest.mark.integration

DAG_ID = "tfpipe_debug"
SECRET_NAME = "API_TOKEN"


class StageWatcher(threading.Thread):
    """Records `docker inspect` of each stage container (not helpers) of a DAG while it exists."""

    def __init__(self, client, dag_id: str):
        super().__init__(daemon=True)
        self.client, self.dag_id = client, dag_id
        self.seen: dict[str, dict] = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            for c in self.client.api.containers(all=True, filters={"label": f"tfpipe.dag_id={self.dag_id}"}):
                labels = c.get("Labels") or {}
                stage = labels.get("tfpipe.stage")
                if stage and "tfpipe.role" not in labels and stage not in self.seen:
                    try:
                        self.seen[stage] = self.client.api.inspect_container(c["Id"])
                    except Exception:  # removed meanwhile
                        pass
            time.sleep(0.05)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, trainer_image, docker_client):
    """A blessed, exported run of a small digits DAG with one public and one private variable."""
    if not DIGITS_CSV.exists():
        pytest.fail(f"{DIGITS_CSV} is missing: run `make data`")
    root = tmp_path_factory.mktemp("debug")
    home, dags = root / "home", root / "dags"
    (home / "data" / "digits").mkdir(parents=True)
    shutil.copy(DIGITS_CSV, home / "data" / "digits" / "digits.csv")
    secret = "s3cr3t-" + __import__("uuid").uuid4().hex
    path = write_dag(dags, DAG_ID, training={"model": "mlp", "epochs": 3, "batch_size": 64},
                     evaluation={"threshold": 0.5, "tolerance": 1.0},
                     # a CPU limit the shell must copy (1.5 of CI's 2 cores: the run stays quick)
                     resources={"cpus": 1.5, "environment": {"TFPIPE_DEBUG_MARK": "public-value"},
                                "private_environment": {SECRET_NAME: "@SECRET@"}})
    # the secret comes from the worker's environment, never from the DAG file's text
    path.write_text(path.read_text().replace("'@SECRET@'", 'os.environ["TFPIPE_TEST_SECRET"]'))
    extra_env = {"TFPIPE_TEST_SECRET": secret}
    watcher = StageWatcher(docker_client, DAG_ID)
    watcher.start()
    try:
        summary, log = run_dag(DAG_ID, {"learning_rate": 0.003}, home=home, image=trainer_image,
                               dags_folder=dags, extra_env=extra_env)
    finally:
        watcher.stop.set()
        watcher.join(timeout=5)
    assert summary["state"] == "success", log[-6000:]
    assert summary["tasks"]["export"]["state"] == "success", "the test DAG's gate blesses every model"
    _, env = dag_command(DAG_ID, None, home=home, image=trainer_image, dags_folder=dags, extra_env=extra_env)
    return {"summary": summary, "home": home, "dags": dags, "env": env, "secret": secret,
            "inspected": watcher.seen, "image": trainer_image}


def _tfpipe(ctx, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfpipe.cli", *args, "--dags-folder", str(ctx["dags"])],
                          env=ctx["env"], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _links(run_id: str) -> dict[str, dict[str, str]]:
    """The extra links the worker stored for each task (what the UI shows)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    links: dict[str, dict[str, str]] = {}
    with create_session() as session:
        for row in session.scalars(XComModel.get_many(run_id=run_id, dag_ids=DAG_ID)):
            if row.key.startswith("_link_"):
                links.setdefault(row.task_id, {})[row.key] = XComModel.deserialize_value(row)
    return links


def test_links_of_the_finished_run_point_at_the_plugin(finished_run):
    from tfpipe.plugins import paths

    run_id, home = finished_run["summary"]["run_id"], finished_run["home"]
    links = _links(run_id)
    assert set(links) == {"validate", "train", "evaluate", "export"}
    for task, task_links in links.items():
        assert task_links["_link_RunReportLink"] == paths.report_url(DAG_ID, run_id)
        if task != "validate":  # the data gate's task has the report only: it trains nothing
            assert task_links["_link_TensorBoardLink"] == paths.tensorboard_url(DAG_ID, run_id)
    run_dir = home / "work" / "runs" / DAG_ID / contract.safe_name(run_id, 120)
    exported = Path(finished_run["summary"]["model_dir"]) / "report" / "report.html"
    assert (run_dir / "report.html").is_file() and exported.is_file()


def test_shell_container_is_the_task_container(finished_run, docker_client):
    ctx = finished_run
    run_id = ctx["summary"]["run_id"]
    task = ctx["inspected"].get("train")
    assert task, f"never saw the train container (saw {sorted(ctx['inspected'])})"
    proc = _tfpipe(ctx, "shell", DAG_ID, "train", "--run", run_id, "--detach")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cid = proc.stdout.strip().splitlines()[-1]
    assert f"left out of the shell (private_environment, values not copied): {SECRET_NAME}" in proc.stderr
    try:
        shell = docker_client.api.inspect_container(cid)
        assert shell["State"]["Running"]
        assert shell["Config"]["Labels"]["tfpipe.role"] == "shell"
        for key in ("tfpipe.dag_id", "tfpipe.run_id", "tfpipe.task_id", "tfpipe.stage", "tfpipe.try_number"):
            assert shell["Config"]["Labels"][key] == task["Config"]["Labels"][key], key
        assert shell["Config"]["Image"] == task["Config"]["Image"] == ctx["image"]
        assert shell["Image"] == task["Image"], "the same image id"

        def mounts(c):
            return sorted((m["Source"], m["Destination"], m["RW"]) for m in c["Mounts"])

        assert mounts(shell) == mounts(task)
        assert ("/data", False) in {(m[1], m[2]) for m in mounts(shell)}
        for key in ("User", "WorkingDir"):
            assert shell["Config"][key] == task["Config"][key], key
        for key in ("NetworkMode", "ShmSize", "Memory", "NanoCpus", "Privileged", "DeviceRequests"):
            assert shell["HostConfig"][key] == task["HostConfig"][key], key
        assert task["HostConfig"]["NanoCpus"] == 1_500_000_000

        task_env = dict(e.split("=", 1) for e in task["Config"]["Env"])
        shell_env = dict(e.split("=", 1) for e in shell["Config"]["Env"])
        assert task_env[SECRET_NAME] == ctx["secret"], "the task itself had the secret"
        assert SECRET_NAME not in shell_env and ctx["secret"] not in json.dumps(shell)
        assert json.loads(shell_env[contract.CONFIG_ENV]) == json.loads(task_env[contract.CONFIG_ENV])
        assert json.loads(shell_env[contract.CONFIG_ENV])["training"]["learning_rate"] == 0.003, "the run's conf"
        assert shell_env == {k: v for k, v in task_env.items() if k != SECRET_NAME}

        # the stage reruns by hand in it: train resumes from its final checkpoint and reports
        rerun = subprocess.run(["docker", "exec", cid, "python3", "-m", "trainer", "train"],
                               capture_output=True, text=True, timeout=180)
        assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
        result = contract.parse_result_line(rerun.stdout.splitlines())
        assert result and result["resumed_from"]["step"] == result["steps"]
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


def test_shell_print_and_jupyter(finished_run):
    ctx = finished_run
    run_id = ctx["summary"]["run_id"]
    printed = _tfpipe(ctx, "shell", DAG_ID, "evaluate", "--run", "latest", "--print")
    assert printed.returncode == 0, printed.stderr[-3000:]
    line = printed.stdout.strip()
    assert line.startswith("docker run --rm") and "tfpipe.role=shell" in line and ctx["image"] in line
    assert f"tfpipe.run_id={run_id}" in line, "latest is the newest run dir"
    assert ctx["secret"] not in line and f"{SECRET_NAME}=" not in line
    jupyter = _tfpipe(ctx, "shell", DAG_ID, "evaluate", "--run", run_id, "--jupyter")
    assert jupyter.returncode == 2
    assert "has no Jupyter" in jupyter.stderr and "docker/requirements.lock" in jupyter.stderr


def test_shell_takes_the_image_the_run_recorded_while_the_engine_has_it_and_the_try_asked_for(
        finished_run, docker_client):
    ctx = finished_run
    run_id = ctx["summary"]["run_id"]
    alias = f"tfpipe/trainer:shell-test-{uuid.uuid4().hex[:8]}"
    docker_client.images.get(ctx["image"]).tag(alias)
    try:
        # the DAG now names another image (the Variable changed since the run): the run's image wins
        renamed = {**ctx, "env": {**ctx["env"], "TFPIPE_IMAGE": alias, "AIRFLOW_VAR_TFPIPE_IMAGE": alias}}
        printed = _tfpipe(renamed, "shell", DAG_ID, "evaluate", "--run", run_id, "--try", "3", "--print")
        assert printed.returncode == 0, printed.stderr[-3000:]
        assert f"the run's evaluate ran on {ctx['image']}; the DAG now names {alias}: using {ctx['image']}" \
            in printed.stderr, printed.stderr[-3000:]
        assert f" {ctx['image']} " in printed.stdout and alias not in printed.stdout
        # --try 3: that try's labels and stage config
        assert "--label tfpipe.try_number=3 " in printed.stdout and '"try_number":3}' in printed.stdout
    finally:
        docker_client.images.remove(alias)
    # an image the engine no longer has: the DAG's, said so
    run_dir = contract.run_dir(DAG_ID, run_id)  # /work/... inside the stages; the DAG's work volume is home/work
    recorded = Path(contract.stage_config_path(str(ctx["home"] / "work") + run_dir[len("/work"):], "evaluate"))
    original = recorded.read_text()
    gone = f"tfpipe/trainer:gone-{uuid.uuid4().hex[:8]}"
    recorded.write_text(original.replace(ctx["image"], gone))
    try:
        printed = _tfpipe(ctx, "shell", DAG_ID, "evaluate", "--run", run_id, "--print")
    finally:
        recorded.write_text(original)
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert f"the run's evaluate ran on {gone}, which the engine no longer has: using the DAG's {ctx['image']}" \
        in printed.stderr, printed.stderr[-3000:]
    assert f" {ctx['image']} " in printed.stdout



def test_tensorboard_serves_the_run(finished_run, docker_client):
    ctx = finished_run
    run_id = ctx["summary"]["run_id"]
    port = free_port()
    proc = _tfpipe(ctx, "tensorboard", DAG_ID, run_id, "--port", str(port), "--detach")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cid, url = proc.stdout.strip().splitlines()[-2:]
    assert url == run_links.tensorboard_url(DAG_ID, run_id, base=f"http://localhost:{port}")
    try:
        deadline, status, last = time.time() + 90, None, None
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
                    status = resp.status
                    break
            except OSError as err:
                last = err
                time.sleep(0.5)
        assert status == 200, f"TensorBoard did not answer on port {port}: {last}"
        # the run is there, named as the link's filter expects
        deadline = time.time() + 30
        while time.time() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as resp:
                runs = json.loads(resp.read())
            if runs:
                break
            time.sleep(0.5)
        assert runs == [run_links.tensorboard_run_name(DAG_ID, run_id)]
        # the task's non-root user, the run's event files read-only, the port on the loopback only
        board = docker_client.api.inspect_container(cid)
        train = ctx["inspected"].get("train")
        assert train, f"never saw the train container (saw {sorted(ctx['inspected'])})"
        assert board["Config"]["User"] == train["Config"]["User"] == "1000:1000"
        event_dir = str(ctx["home"] / "work" / "runs" / DAG_ID / contract.safe_name(run_id, 120) / "train" / "tensorboard")
        assert [(m["Source"], m["Destination"], m["RW"]) for m in board["Mounts"]] == [
            (event_dir, f"/logs/{run_links.tensorboard_run_name(DAG_ID, run_id)}", False)]
        assert board["HostConfig"]["PortBindings"] == {"6006/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


def test_ui_tensorboards_are_unprivileged_read_only_offline_and_capped(tmp_path, trainer_image, monkeypatch):
    """The api-server's TensorBoard container, and at most TFPIPE_TENSORBOARD_MAX (default 4) of them."""
    from tfpipe.plugins.run_access import TensorBoards, api_client

    # a role of this test's own, so TensorBoards of real runs on the shared engine are never touched
    boards = TensorBoards(role=f"ui-tensorboard-test-{uuid.uuid4().hex[:8]}")
    dag_id = f"tfpipe_tb_cap_{uuid.uuid4().hex[:6]}"
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)
    location = {"docker_url": "unix://var/run/docker.sock", "image": trainer_image, "work": str(work)}
    cli = api_client(location["docker_url"])

    def left() -> list[str]:
        found = cli.containers(all=True, filters={"label": f"tfpipe.role={boards.role}"})
        return sorted(c["Labels"]["tfpipe.tensorboard"].split("/", 1)[1] for c in found)

    try:
        now = time.time()
        for age, run_id in zip((40, 30, 20, 10), ("old_0", "old_1", "old_2", "old_3")):
            # created, never started: eviction goes by labels and last use alone
            cli.create_container(trainer_image, command=["true"], entrypoint=[],
                                 labels={"tfpipe.role": boards.role, "tfpipe.tensorboard": f"{dag_id}/{run_id}"})
            boards.mark_used(dag_id, run_id, at=now - age)
        monkeypatch.delenv("TFPIPE_TENSORBOARD_MAX", raising=False)
        monkeypatch.setenv("TFPIPE_TENSORBOARD_IDLE_S", "1800")
        cid = boards._ensure(cli, location, dag_id, "new_a")
        boards.mark_used(dag_id, "new_a")
        assert left() == ["new_a", "old_1", "old_2", "old_3"], "four by default: the least recently used went"

        board = cli.inspect_container(cid)
        assert board["State"]["Running"]
        assert board["Config"]["User"] == "65534:65534", "an unprivileged uid, not the image's or root"
        assert not board["HostConfig"]["Privileged"] and board["HostConfig"]["NetworkMode"] == "none"
        assert [(m["Source"], m["Destination"], m["RW"]) for m in board["Mounts"]] == [
            (str(work), contract.CONTAINER_WORK, False)], "the work volume only, read-only"

        monkeypatch.setenv("TFPIPE_TENSORBOARD_MAX", "2")
        boards._ensure(cli, location, dag_id, "new_b")
        assert left() == ["new_a", "new_b"], "TFPIPE_TENSORBOARD_MAX=2: the two most recently used stay"
    finally:
        for c in cli.containers(all=True, filters={"label": f"tfpipe.role={boards.role}"}):
            cli.remove_container(c["Id"], force=True)
        cli.close()


def _png_rows(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the decompressed (still filtered) scanlines of a non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and interlace == 0
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    raw = zlib.decompress(idat)
    stride = 1 + width * channels
    return width, height, [raw[i * stride:(i + 1) * stride] for i in range(height)]


def _own_tmp(profile: str) -> dict[str, str]:
    """The environment for a Chromium whose profile is ``profile``: its temporary files go there
    too. Chromium keeps its single-instance socket in a directory of its own under TMPDIR, which a
    terminated Chromium leaves behind: one more in /tmp for every test run, without this."""
    return {**os.environ, "TMPDIR": profile}


@contextlib.contextmanager
def _chromium_page(chromium: str, url: str):
    """Headless Chromium showing ``url``; yields ``evaluate(js)`` (DevTools Runtime.evaluate)."""
    from websockets.sync.client import connect

    port = free_port()
    profile = tempfile.mkdtemp(prefix="chromium-")
    proc = subprocess.Popen(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--remote-debugging-address=127.0.0.1", f"--remote-debugging-port={port}", url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_own_tmp(profile))
    try:
        deadline, pages = time.time() + 60, []
        while time.time() < deadline and not pages:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as resp:
                    pages = [p for p in json.loads(resp.read()) if p.get("type") == "page"]
            except OSError:
                time.sleep(0.3)
        assert pages, "headless Chromium opened no page"
        with connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            ids = iter(range(1, 1 << 30))

            def evaluate(expression: str):
                call = next(ids)
                ws.send(json.dumps({"id": call, "method": "Runtime.evaluate",
                                    "params": {"expression": expression, "returnByValue": True}}))
                reply = json.loads(ws.recv(timeout=30))
                while reply.get("id") != call:  # events interleave with the answer
                    reply = json.loads(ws.recv(timeout=30))
                return reply["result"]["result"].get("value")

            yield evaluate
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def _wait_until(evaluate, expression: str, timeout: float = 30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = evaluate(expression)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"never true in the page: {expression}")


def test_report_plots_decode_in_headless_chromium(finished_run):
    """The plots are images the browser decoded (non-zero natural size), not broken placeholders."""
    with _chromium_page(chromium_path(), _report_file(finished_run).as_uri()) as evaluate:
        images = json.loads(_wait_until(evaluate, (
            # the tab shows about:blank first: wait for the report itself to have loaded
            "location.protocol === 'file:' && document.readyState === 'complete' ? "
            "JSON.stringify(Array.from(document.images, i => "
            "({alt: i.alt, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight}))) : null")))
    alts = sorted(i["alt"] for i in images)
    assert alts == sorted(["training and validation loss per epoch", "training and validation accuracy per epoch",
                           "confusion matrix of the eval split"]), images
    for image in images:
        assert image["complete"] and image["width"] > 100 and image["height"] > 100, image


def _report_file(finished_run) -> Path:
    run_id = finished_run["summary"]["run_id"]
    return finished_run["home"] / "work" / "runs" / DAG_ID / contract.safe_name(run_id, 120) / "report.html"


def test_report_renders_in_headless_chromium(finished_run, tmp_path):
    chromium = chromium_path()
    link = _report_file(finished_run).as_uri()  # the file itself; tests/ui opens it through the api-server's plugin
    out = tmp_path / "report.png"
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        proc = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             f"--screenshot={out}", "--window-size=1200,1600", link],
            capture_output=True, text=True, timeout=120, env=_own_tmp(profile))
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert out.is_file(), f"no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}"
    assert out.stat().st_size > 10 * 1024
    width, height, rows = _png_rows(out.read_bytes())
    assert (width, height) == (1200, 1600)
    # a blank page has (almost) one distinct scanline; the report has text, tables and plots
    assert len(set(rows)) > 100, f"the screenshot looks blank ({len(set(rows))} distinct rows)"
    assert len(set(b"".join(rows[::40]))) > 32, "the screenshot has hardly any distinct byte values"
