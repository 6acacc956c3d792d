"""The pipeline in a real deployment: ``make up``'s stack, driven through the REST API v2 and the UI.

The scheduler, the Celery workers (whose mount namespace hides the GPU host's disks), PostgreSQL,
Redis and the TLS engine are all real; every stage container runs on the TLS engine, from the
image it pulled from the loopback registry by digest.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import chromium_path, goto
from tests.deployment.conftest import TERMINAL, free_port, stack_cli

pytestmark = [pytest.mark.integration, pytest.mark.deployment]

DIGITS = "tfpipe_digits"
REPO = Path(__file__).resolve().parents[2]


def _started(docker, run_id: str, since: float) -> list[dict]:
    """The labels of the stage containers of ``run_id`` that an engine started, in order (``docker``
    runs that engine's CLI)."""
    out = docker("events", "--since", str(int(since)), "--until", str(int(time.time()) + 1),
                 "--filter", "event=start", "--filter", f"label=tfpipe.run_id={run_id}",
                 "--format", "{{json .Actor.Attributes}}").stdout
    attrs = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [a for a in attrs if a.get("tfpipe.role") != "prepare-volumes"]


def _first_engine_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True)


def _engine_events(stack, run_id: str, since: float) -> list[str]:
    """Stage containers of ``run_id`` that the TLS engine started (task ids, in order)."""
    return [a.get("tfpipe.task_id") for a in _started(stack.engine_docker, run_id, since)]


def _first_engine_events(run_id: str, since: float) -> str:
    return subprocess.run(["docker", "events", "--since", str(int(since)), "--until", str(int(time.time()) + 1),
                           "--filter", f"label=tfpipe.run_id={run_id}"], capture_output=True, text=True).stdout


def _interval(ti: dict) -> tuple[datetime, datetime]:
    return (datetime.fromisoformat(ti["start_date"].replace("Z", "+00:00")),
            datetime.fromisoformat(ti["end_date"].replace("Z", "+00:00")))


def test_up_prints_the_ui_url_and_admin_credentials_and_the_image_travels_by_digest(stack, rest):
    """make up prints where the UI is and how to log in; the GPU host got the image from the registry by digest."""
    assert f"UI and REST API: {stack.api_url}" in stack.up_output, stack.up_output
    assert f"admin user:      admin   password: {stack.admin_password()}" in stack.up_output
    assert rest.get("monitor/health")["scheduler"]["status"] == "healthy"
    ref = stack.image_ref()
    assert ref.startswith(f"{stack.registry}/tfpipe/trainer@sha256:"), ref
    digests = json.loads(stack.engine_docker("image", "inspect", "--format", "{{json .RepoDigests}}", ref).stdout)
    assert ref in digests
    pull_log, migrate_log = stack.logs / "pull.log", stack.logs / "migrate.log"
    assert pull_log.read_text().strip() == ref
    assert "the GPU host pulls it while Airflow starts" in stack.up_output
    if not stack.layers_were_on_gpu_host:
        # The GPU host pulled while Airflow migrated and started: `docker pull -q` writes its log
        # only when done, after the migration's log (a pull before the migration would end first).
        # A session after one that pulled this digest or an earlier build into the kept data root
        # finds every layer or all but the small code layer there, and its pull ends at once: then
        # only that it ran can be seen.
        assert pull_log.stat().st_mtime > migrate_log.stat().st_mtime, stack.up_output
    # The first engine keeps no trace of the registry name (the push tag was removed again).
    first = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                           text=True, check=True).stdout
    assert f"{stack.registry}/" not in first


def test_status_lists_each_part_with_its_pid_health_and_urls(stack):
    """`make status` (deploy/stack.py status): every part's pid, the health of the scheduler, the
    dag-processor and the triggerer, and the URLs; exit 0 while every part runs."""
    proc = stack_cli(stack.env, "status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.startswith("  ")}
    for part in ("api-server", "scheduler", "dag-processor", "triggerer", "worker1", "engine", "registry",
                 "redis", "postgres"):
        assert rows[part][1:] == ["pid", str(stack.pid(part))], (part, proc.stdout)
    health = dict(item.split("=") for item in " ".join(rows["health:"][1:]).split(", "))
    assert {health[p] for p in ("scheduler", "dag_processor", "triggerer")} == {"healthy"}, health
    assert f"UI and REST API: {stack.api_url}" in proc.stdout
    assert f"image: {stack.image_ref()}" in proc.stdout



def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")


def test_the_parts_run_as_readme_s_table_says(stack):
    """Debian's PostgreSQL (15 on Debian 12) as the ``postgres`` user, Celery workers of the
    configured concurrency (1 by default), and the GPU host's engine on its own bridge without
    iptables rules, with ``TFPIPE_STACK_ENGINE_ARGS`` among its flags (the session sets a label
    there, which ``docker info`` on that engine shows)."""
    pg = stack.pid("postgres")
    binary = os.path.realpath(f"/proc/{pg}/exe")
    major = Path(binary).parents[1].name
    assert binary == f"/usr/lib/postgresql/{major}/bin/postgres", binary
    if Path("/etc/debian_version").read_text().startswith("12."):
        assert major == "15", "README's table says PostgreSQL 15, Debian 12's"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    assert version.startswith(f"postgres (PostgreSQL) {major}."), version
    assert os.stat(f"/proc/{pg}").st_uid == int(subprocess.check_output(["id", "-u", "postgres"]))
    argv = _cmdline(pg)
    assert argv[argv.index("-D") + 1] == str(stack.pg_data), argv

    workers = int(stack.settings["workers"])
    assert workers == 2 and stack.settings["concurrency"] == "1", "the session runs make up's defaults"
    for n in range(1, workers + 1):
        # Celery may retitle its process; the title keeps the options it was started with.
        title = " ".join(_cmdline(stack.pid(f"worker{n}")))
        assert re.search(rf"--concurrency[ =]{stack.settings['concurrency']}\b", title), title

    argv = _cmdline(stack.pid("engine"))
    assert argv[argv.index("--bridge") + 1] == stack.settings["bridge"] != "docker0", argv
    assert "--iptables=false" in argv
    extra = shlex.split(stack.settings["engine_args"])
    assert extra and argv[-len(extra):] == extra, argv
    labels = json.loads(stack.engine_docker("info", "--format", "{{json .Labels}}").stdout)
    assert "tfpipe.stack-test=engine-args" in labels, labels


#: An unprivileged user to run `make status` / `make down` as, as a user would without sudo.
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_status_and_down_without_sudo_say_to_use_sudo_and_stop_nothing(stack, rest):
    """`sudo make up`, then a plain `make status` or `make down`: each says that root started the stack
    and to run it with sudo, exits non-zero without a traceback, and every part of the stack runs on."""
    names = stack.names()
    pids = {name: stack.pid(name) for name in names}
    assert all(pids.values()), pids
    for command in ("status", "down"):
        proc = subprocess.run([*NOBODY, sys.executable, str(REPO / "deploy" / "stack.py"), command], env=stack.env,
                              capture_output=True, text=True)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out
        assert f"the stack in {stack.dir} was started by root: run `sudo make {command}`" in proc.stderr, out
        assert "Traceback" not in out, out
    assert {name: stack.pid(name) for name in names} == pids
    health = rest.get("monitor/health")
    assert {health[p]["status"] for p in ("metadatabase", "scheduler", "dag_processor", "triggerer")} == {"healthy"}


def test_sourcing_stack_env_gives_a_shell_the_stack_s_airflow_cli(stack, rest):
    """`source .stack/stack.env` in a shell with no Airflow settings and no venv on PATH: its `airflow`
    lists the stack's DAGs (the stack's own DAG bundles) with the pause state the stack's API reports."""
    shell = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    proc = subprocess.run(["bash", "-c", f"source {stack.dir / 'stack.env'} && airflow dags list -o json"],
                          env=shell, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    listed = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("[")))
    dags = {d["dag_id"]: d for d in listed}
    assert dags[DIGITS]["bundle_name"] == "dags-folder", dags
    # Only the stack's settings name this bundle: the test DAGs under tests/deployment/dags.
    assert dags["tfpipe_stack_cron"]["bundle_name"] == "extra-dags", dags
    api_paused = rest.get(f"dags/{DIGITS}")["is_paused"]
    assert str(dags[DIGITS]["is_paused"]) == str(api_paused), (dags[DIGITS], api_paused)


CRON = "tfpipe_stack_cron"
ON_DATA = "tfpipe_digits_on_data"


@pytest.fixture(scope="module")
def kickoff(stack, rest):
    """Start the runs of tests 1, 3 and 4 together (each test then waits for its own), to keep the module short.

    The UI test runs while they do; the two-runs test comes after them, on idle workers.
    """
    since = time.time() - 1
    started = {"since": since, "rest_run": rest.trigger(DIGITS, conf={"epochs": 2, "batch_size": 100, "seed": 7})}
    rest.unpause(CRON)
    rest.unpause(ON_DATA)
    data_uri = f"file://{stack.volumes}/data/digits"
    assets = {a["uri"]: a for a in rest.get("assets", params={"limit": 100})["assets"]}
    assert data_uri in assets, sorted(assets)
    rest.request("POST", "assets/events", json={"asset_id": assets[data_uri]["id"], "extra": {"by": "stack test"}})
    return started


def _first_run(rest, dag_id: str, run_type: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        runs = [r for r in rest.get(f"dags/{dag_id}/dagRuns", params={"order_by": "start_date"})["dag_runs"]
                if r["run_type"] == run_type]
        if runs:
            return runs[0]
        assert time.monotonic() < deadline, f"no {run_type} run of {dag_id} within {timeout:.0f} s"
        time.sleep(2)


def test_rest_trigger_with_conf_runs_on_the_tls_engine(stack, rest, kickoff):
    """(1) A REST trigger with conf runs to success; the conf reaches training; containers ran on the TLS engine."""
    since, run_id = kickoff["since"], kickoff["rest_run"]
    run = rest.wait_for_run(DIGITS, run_id, timeout=480)
    tis = {t["task_id"]: t for t in rest.task_instances(DIGITS, run_id)}
    assert run["state"] == "success", {k: v["state"] for k, v in tis.items()}
    train = rest.xcom(DIGITS, run_id, "train")
    assert train["epochs"] == 2
    train_count = rest.xcom(DIGITS, run_id, "prep")["examples"]["train"]
    assert train["steps_per_epoch"] == math.ceil(train_count / 100)
    # The run directory is on the GPU host's work volume ...
    run_dir = stack.volumes / "work" / "runs" / DIGITS / run_id
    assert run_dir.is_dir(), f"no run dir {run_dir} on the GPU host"
    # ... every stage container was started by the TLS engine, none by the first engine.
    started = _engine_events(stack, run_id, since)
    assert {"prep", "train", "evaluate"} <= set(started), started
    assert _first_engine_events(run_id, since) == ""
    # ... and nothing of it is visible to a worker: its mount namespace shows an empty tmpfs there.
    for n in (1, 2):
        seen = subprocess.run(["nsenter", "-t", str(stack.pid(f"worker{n}")), "-m", "--", "ls", "-A",
                               str(stack.gpuhost)], capture_output=True, text=True)
        assert seen.returncode == 0 and seen.stdout.strip() == "", (n, seen.stdout, seen.stderr)


def test_the_report_and_tensorboard_come_through_the_tls_engine(stack, rest, kickoff):
    """(1b) The api-server's plugin reads the run's report, and starts its TensorBoard, on the TLS engine.

    The api-server cannot see the GPU host's volumes either: it reaches them only through the engine,
    presenting the deployment's [tfpipe] client certificate.
    """
    from urllib.parse import quote

    run_id = kickoff["rest_run"]
    assert rest.wait_for_run(DIGITS, run_id, timeout=480)["state"] == "success"
    base = f"{rest.base}/tfpipe/runs/{DIGITS}/{quote(run_id, safe='')}"
    resp = rest.session.get(f"{base}/report/", timeout=120)
    assert resp.status_code == 200, resp.text[:2000]
    assert run_id in resp.text and "data:image/png;base64," in resp.text
    png = rest.session.get(f"{base}/report/loss.png", timeout=120)
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    tb = rest.session.get(f"{base}/tensorboard/data/runs", timeout=400)
    assert tb.status_code == 200 and tb.json(), tb.text[:2000]
    from tfpipe.plugins.run_access import TENSORBOARD_ROLE

    on_engine = stack.engine_docker("ps", "-q", "--filter", f"label=tfpipe.role={TENSORBOARD_ROLE}").stdout.split()
    on_first = subprocess.run(["docker", "ps", "-q", "--filter", f"label=tfpipe.role={TENSORBOARD_ROLE}",
                               "--filter", f"label=tfpipe.tensorboard={DIGITS}/{run_id}"],
                              capture_output=True, text=True, check=True).stdout.split()
    assert on_engine and not on_first, (on_engine, on_first)


def test_tfpipe_shell_and_tensorboard_start_on_the_tls_engine(stack, rest, kickoff):
    """(1c) A shell that sourced ``stack.env`` runs ``tfpipe shell`` and ``tfpipe tensorboard``: both
    start on the GPU host's TLS engine with the deployment's client certificate, as the run's tries
    did, and the shell sees the run's directory there; nothing starts on the first engine."""
    import shlex

    run_id = kickoff["rest_run"]
    assert rest.wait_for_run(DIGITS, run_id, timeout=480)["state"] == "success"
    clean = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    started = []
    try:
        for command in (f"shell {DIGITS} train --run {shlex.quote(run_id)} --detach",
                        f"tensorboard {DIGITS} {shlex.quote(run_id)} --port {free_port()} --detach"):
            proc = subprocess.run(["bash", "-c", f"source {stack.dir / 'stack.env'} && tfpipe {command}"],
                                  env=clean, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, (command, proc.stdout, proc.stderr[-3000:])
            started.append(proc.stdout.strip().splitlines()[0])
            if command.startswith("tensorboard"):
                # the stack's engine listens on this machine's loopback: its port needs no tunnel
                assert "TensorBoard for" in proc.stderr and "ssh -N -L" not in proc.stderr, proc.stderr
        shell, board = started
        labels = json.loads(stack.engine_docker("inspect", "--format", "{{json .Config.Labels}}", shell).stdout)
        assert (labels["tfpipe.role"], labels["tfpipe.run_id"], labels["tfpipe.task_id"]) == ("shell", run_id, "train")
        seen = stack.engine_docker("exec", shell, "python3", "-c", "import json, os; c = json.loads(os.environ"
                                   "['TFPIPE_CONFIG']); print(c['run']['run_id'], os.path.isdir(c['paths']['run_dir']))")
        assert seen.stdout.split() == [run_id, "True"], seen.stdout
        board_labels = json.loads(stack.engine_docker("inspect", "--format", "{{json .Config.Labels}}",
                                                      board).stdout)
        assert board_labels["tfpipe.tensorboard"] == f"{DIGITS}/{run_id}"
        on_first = _first_engine_cli("ps", "-aq", "--filter", f"id={shell}", "--filter", f"id={board}").stdout
        assert on_first.strip() == "", on_first
    finally:
        for cid in started:
            stack.engine_docker("rm", "-f", cid, check=False)


def test_a_misspelt_run_parameter_fails_before_any_container_starts(stack, rest):
    """(5) A REST trigger whose conf misspells a Param fails at once with a did-you-mean; nothing ran."""
    since = time.time() - 1
    run_id = rest.trigger(DIGITS, conf={"epoch": 3})
    _refused_before_any_container(stack, rest, DIGITS, run_id, since, first_task="prep")


def _refused_before_any_container(stack, rest, dag_id: str, run_id: str, since: float, *, first_task: str) -> None:
    """The run of a conf with the misspelt key ``epoch`` failed with the did-you-mean, and no engine ran anything."""
    run = rest.wait_for_run(dag_id, run_id, timeout=240)
    assert run["state"] == "failed"
    tis = {t["task_id"]: t for t in rest.task_instances(dag_id, run_id)}
    states = {k: (v["state"], v["try_number"]) for k, v in tis.items()}
    # The first task and the cleanup teardown refuse the conf (once each, no retry); the rest never start.
    failed = sorted(k for k, v in tis.items() if v["state"] == "failed")
    assert failed == sorted(["cleanup", first_task]) and all(tis[k]["try_number"] == 1 for k in failed), states
    assert all(v["state"] == "upstream_failed" for k, v in tis.items() if k not in failed), states
    for task_id in failed:
        text = rest.task_log(dag_id, run_id, task_id, 1)
        assert "unknown run parameter 'epoch' (did you mean 'epochs'?)" in text, text[-3000:]
        assert "Nothing ran." in text
    on_engine = stack.engine_docker("events", "--since", str(int(since)), "--until", str(int(time.time()) + 1),
                                    "--filter", f"label=tfpipe.run_id={run_id}").stdout
    assert on_engine == "" and _first_engine_events(run_id, since) == "", on_engine


#: Page loads of the trigger form before a ``fill`` step that keeps timing out fails the test.
FORM_TRIES = 3


def _trigger_in_ui(stack, rest, dag_id: str, tmp_path, fill) -> str:
    """Open ``dag_id``'s trigger form in headless Chromium, let ``fill(page)`` edit it, press Trigger.

    Returns the id of the one run the form created (a screenshot lands in ``tmp_path`` on failure).
    """
    chromium = chromium_path()
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    rest.unpause(dag_id)
    before = {r["dag_run_id"] for r in rest.get(f"dags/{dag_id}/dagRuns")["dag_runs"]}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            goto(page, f"{stack.api_url}/", wait_until="networkidle")
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", stack.admin_password())
            page.keyboard.press("Enter")
            page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30000)
            for attempt in range(1, FORM_TRIES + 1):
                goto(page, f"{stack.api_url}/dags/{dag_id}", wait_until="networkidle")
                page.get_by_role("button", name="Trigger").first.click()
                page.locator("input[name=element_epochs]").wait_for(timeout=30000)
                try:
                    fill(page)
                    break
                except PlaywrightTimeout:
                    # Airflow's UI fetches the JSON editor's modules when the form first needs them;
                    # if that fails (seen once in CI on a loaded machine) the editor never renders
                    # on that page. A fresh page load fetches them again; no run was triggered yet.
                    if attempt == FORM_TRIES:
                        raise
                    print(f"trigger form: {fill.__name__} timed out on try {attempt}; reloading the page")
            page.get_by_role("dialog").get_by_role("button", name="Trigger").click()
            deadline = time.monotonic() + 30
            new: set[str] = set()
            while time.monotonic() < deadline and not new:
                new = {r["dag_run_id"] for r in rest.get(f"dags/{dag_id}/dagRuns")["dag_runs"]} - before
                time.sleep(1)
        except Exception:
            page.screenshot(path=str(tmp_path / "ui.png"))
            raise
        finally:
            browser.close()
    assert len(new) == 1, f"the form created no run (screenshot in {tmp_path})"
    return new.pop()


def test_ui_trigger_form_changes_a_parameter(stack, rest, kickoff, tmp_path):
    """(2) The UI's trigger form in headless Chromium starts a run with a changed parameter; the run uses it."""
    dag_id = "tfpipe_digits_manual"
    run_id = _trigger_in_ui(stack, rest, dag_id, tmp_path, lambda page: page.fill("input[name=element_epochs]", "3"))
    run = rest.wait_for_run(dag_id, run_id, timeout=480)
    assert run["conf"].get("epochs") == 3, run["conf"]
    assert run["state"] == "success"
    assert rest.xcom(dag_id, run_id, "train")["epochs"] == 3


def test_a_misspelt_parameter_in_the_ui_s_configuration_json_fails_the_same_way(stack, rest, tmp_path):
    """(5, UI) The trigger form's Advanced Options JSON with a misspelt key: the same did-you-mean failure."""
    dag_id = "tfpipe_digits_manual"

    def misspell(page) -> None:
        page.get_by_role("dialog").get_by_text("Advanced Options").click()
        page.locator(".monaco-editor .view-lines").first.click(timeout=20000)
        page.keyboard.press("Control+A")
        # Pasted, not typed: the JSON editor completes quotes and braces as one types.
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack.api_url)
        page.evaluate("text => navigator.clipboard.writeText(text)", '{"epoch": 3}')
        page.keyboard.press("Control+V")

    since = time.time() - 1
    run_id = _trigger_in_ui(stack, rest, dag_id, tmp_path, misspell)
    assert rest.wait_for_run(dag_id, run_id, timeout=240)["conf"] == {"epoch": 3}
    _refused_before_any_container(stack, rest, dag_id, run_id, since, first_task="stage_in")


def test_cron_schedule_creates_a_run_that_succeeds(stack, rest, kickoff):
    """(3) A one-minute cron DAG gets a run created by the scheduler, and it succeeds."""
    try:
        first = _first_run(rest, CRON, "scheduled", timeout=150)
        run = rest.wait_for_run(CRON, first["dag_run_id"], timeout=480)
        assert run["state"] == "success"
        assert run["run_type"] == "scheduled"
    finally:
        # Paused, a DAG's running runs stall: end them, so they hold no worker slot later on.
        rest.unpause(CRON, paused=True)
        for other in rest.get(f"dags/{CRON}/dagRuns")["dag_runs"]:
            if other["state"] not in TERMINAL:
                rest.request("PATCH", f"dags/{CRON}/dagRuns/{other['dag_run_id']}", json={"state": "failed"})


def test_asset_event_triggers_the_on_data_dag_which_emits_the_model_asset(stack, rest, kickoff):
    """(4) An Asset event on the data asset (REST) triggers the on-data DAG; its export emits the model asset."""
    run_id = _first_run(rest, ON_DATA, "asset_triggered", timeout=120)["dag_run_id"]
    run = rest.wait_for_run(ON_DATA, run_id, timeout=480)
    states = {t["task_id"]: t["state"] for t in rest.task_instances(ON_DATA, run_id)}
    assert run["state"] == "success" and states["export"] == "success", states
    model = {a["uri"]: a for a in rest.get("assets", params={"limit": 100})["assets"]}["tfpipe://models/digits"]
    events = rest.get("assets/events", params={"asset_id": model["id"]})["asset_events"]
    assert [e for e in events if e["source_run_id"] == run_id and e["source_task_id"] == "export"], events


#: Epochs of each run of the parallel DAG: enough for one run's training to outlast the scheduler's
#: gaps of 4-11 s between a run's tasks (150 epochs took 8-9 s on an idle 2-core machine). With the
#: DAG's one epoch every task took 1-3 s, and the two runs could interleave on the two workers with
#: no two tasks running at the same moment. When one run's training ends, the other's starts (the
#: pool's slot) beside the first run's evaluate and export.
PARALLEL_EPOCHS = 200


def test_two_runs_at_once_on_two_workers_share_one_gpu_slot(stack, rest):
    """(7) Two runs at once on two workers: separate run dirs, distinct versions, train never overlaps (pool)."""
    dag_id = "tfpipe_stack_parallel"
    assert rest.get("pools/gpu")["slots"] == 1
    runs = [rest.trigger(dag_id, conf={"seed": seed, "epochs": PARALLEL_EPOCHS}) for seed in (1, 2)]
    for run_id in runs:
        assert rest.wait_for_run(dag_id, run_id, timeout=480)["state"] == "success"
    tis = {r: {t["task_id"]: t for t in rest.task_instances(dag_id, r)} for r in runs}
    # The runs overlapped, and tasks of both ran at the same moment on different workers (Celery's
    # log names every task a worker ran; with one slot per worker, overlapping tasks need two).
    logs = {n: (stack.logs / f"worker{n}.log").read_text(errors="replace") for n in (1, 2)}

    def worker_of(run_id: str, task_id: str) -> set[int]:
        return {n for n, text in logs.items() if f"run_id={run_id}/task_id={task_id}/" in text}

    side_by_side = [
        (ta, tb) for ta, a in tis[runs[0]].items() for tb, b in tis[runs[1]].items()
        if a["try_number"] and b["try_number"] and a["start_date"] and b["start_date"]
        and _interval(a)[0] < _interval(b)[1] and _interval(b)[0] < _interval(a)[1]
    ]
    assert side_by_side, ("no task of one run ran while a task of the other did", {
        r: {t: (a["start_date"], a["end_date"]) for t, a in tis[r].items()} for r in runs})
    ta, tb = side_by_side[0]
    workers = (worker_of(runs[0], ta), worker_of(runs[1], tb))
    assert all(len(w) == 1 for w in workers) and workers[0] != workers[1], (side_by_side, workers)
    # The gpu pool's one slot kept the two trainings apart.
    train_a, train_b = (_interval(tis[r]["train"]) for r in runs)
    assert train_a[1] <= train_b[0] or train_b[1] <= train_a[0], (train_a, train_b)
    assert all(tis[r]["train"]["pool"] == "gpu" for r in runs)
    exports = [rest.xcom(dag_id, r, "export") for r in runs]
    assert exports[0]["version"] != exports[1]["version"], exports
    ckpts = [rest.xcom(dag_id, r, "train")["checkpoint_dir"] for r in runs]
    assert ckpts[0] != ckpts[1] and all(r in c for r, c in zip(runs, ckpts)), ckpts


#: Seconds a scheduled ``train`` in a pool that does not exist is watched: the scheduler loops about
#: once a second, so it had some 25 chances to queue it.
MISSING_POOL_HOLD = 25


def test_a_task_in_a_missing_pool_is_never_scheduled_and_the_scheduler_says_so(stack, rest):
    """README, "Pools": ``gpu_pool`` names a pool nobody created. ``prep`` runs, ``train`` reaches
    Airflow's state ``scheduled`` and stays there (never queued, never started, no container on the
    engine) while the run stays running; the scheduler's log says why (Airflow's warning, in
    ``logs/scheduler.log``), and ending the run by hand skips ``train``."""
    dag_id, task_id, pool = "tfpipe_stack_missing_pool", "train", "tfpipe_stack_no_such_pool"
    rest.request("GET", f"pools/{pool}", ok=(404,))  # the pool really does not exist
    scheduler_log = stack.logs / "scheduler.log"
    log_offset = scheduler_log.stat().st_size
    since = time.time() - 1
    run_id = rest.trigger(dag_id)
    try:
        waiting = rest.wait_for_task(dag_id, run_id, task_id, {"scheduled", *TERMINAL, "upstream_failed", "queued",
                                                                 "running", "up_for_retry"}, timeout=180)
        states = {t["task_id"]: t["state"] for t in rest.task_instances(dag_id, run_id)}
        assert waiting["state"] == "scheduled" and states["prep"] == "success", states
        assert waiting["pool"] == pool, waiting
        held_until = time.monotonic() + MISSING_POOL_HOLD
        while time.monotonic() < held_until:
            time.sleep(2)
            ti = rest.task_instance(dag_id, run_id, task_id)
            seen = {k: ti[k] for k in ("state", "try_number", "queued_when", "start_date")}
            never_queued = {"state": "scheduled", "try_number": waiting["try_number"], "queued_when": None,
                            "start_date": None}
            assert seen == never_queued, f"{task_id} left 'scheduled': {seen}"
        assert rest.run(dag_id, run_id)["state"] == "running"
        states = {t["task_id"]: t["state"] for t in rest.task_instances(dag_id, run_id)}
        assert states == {"prep": "success", "validate": "success", "train": "scheduled", "evaluate": None,
                          "export": None}, states
        assert task_id not in _engine_events(stack, run_id, since)
        with open(scheduler_log, "rb") as f:
            f.seek(log_offset)
            written = f.read().decode(errors="replace")
        warning = f"Tasks using non-existent pool '{pool}' will not be scheduled"
        assert warning in written, written[-3000:]
    finally:
        # Ended by hand, as an operator would: train is skipped, and the run holds nothing later on.
        rest.request("PATCH", f"dags/{dag_id}/dagRuns/{run_id}", json={"state": "failed"})
        rest.unpause(dag_id, paused=True)
    states = {t["task_id"]: t["state"] for t in rest.task_instances(dag_id, run_id)}
    assert rest.run(dag_id, run_id)["state"] == "failed" and states[task_id] == "skipped", states


def test_sharded_prep_runs_its_shards_on_two_engines_that_share_the_volumes(stack, rest):
    """(7b) ``shard_docker_urls``: shard 0 on the TLS engine, shard 1 on the first engine, at once on two
    workers; the merge (on the deployment's engine) makes the data set one prep task would, and trains on it."""
    from tests.integration.test_sharded_prep import _expected_fingerprint, _split_digits

    dag_id = "tfpipe_stack_shards"
    shutil.rmtree(stack.volumes / "data" / "digits_parts", ignore_errors=True)
    _split_digits(stack.volumes)
    image = stack.image_ref()
    # The first engine pulls the image from the registry by digest (its layers are already there);
    # the reference is removed again afterwards, leaving that shared engine as it was.
    had_image = _first_engine_cli("image", "inspect", image).returncode == 0
    since = time.time() - 1
    try:
        run_id = rest.trigger(dag_id)
        run = rest.wait_for_run(dag_id, run_id, timeout=480)
        tis = rest.task_instances(dag_id, run_id)
        assert run["state"] == "success", [(t["task_id"], t["map_index"], t["state"]) for t in tis]
        on_tls = _started(stack.engine_docker, run_id, since)
        on_first = _started(_first_engine_cli, run_id, since)
    finally:
        if not had_image:
            _first_engine_cli("image", "rm", image)
    # Shard 1 only, and started twice at most: where the DAG's directories on these volumes were not
    # ready yet when it started (its first run), it exits 13 before writing anything, a helper
    # prepares them and it starts again in the same try.
    on_first_tasks = [(a["tfpipe.task_id"], a["tfpipe.map_index"]) for a in on_first]
    assert set(on_first_tasks) == {("prep_shard", "1")} and len(on_first_tasks) <= 2, on_first
    tls_tasks = [(a["tfpipe.task_id"], a["tfpipe.map_index"]) for a in on_tls]
    assert ("prep_shard", "0") in tls_tasks and ("prep_shard", "1") not in tls_tasks, tls_tasks
    assert {"prep_merge", "train", "evaluate"} <= {task for task, _ in tls_tasks}, tls_tasks
    shards = sorted((t for t in tis if t["task_id"] == "prep_shard"), key=lambda t: t["map_index"])
    assert [(t["map_index"], t["state"], t["try_number"]) for t in shards] == [(0, "success", 1), (1, "success", 1)]
    # One data set from both engines' parts: the fingerprint of an unsharded prep of the same files
    pointer = json.loads((stack.volumes / "work" / "runs" / dag_id / run_id / "dataset.json").read_text())
    assert pointer["fingerprint"] == _expected_fingerprint(stack.volumes, 2)
    dataset = stack.volumes / "work" / "datasets" / pointer["fingerprint"]
    parts = json.loads((dataset / "fingerprint.json").read_text())["parts"]
    assert [p["index"] for p in parts] == [0, 1]
    assert sum(json.loads((dataset / "schema.json").read_text())["counts"].values()) == 1797



def _scale_column(folder: Path, column: str, factor: float) -> None:
    """Multiply ``column`` of every CSV file in ``folder`` by ``factor`` (a unit change upstream)."""
    for path in folder.glob("*.csv"):
        header, *rows = path.read_text().splitlines()
        at = header.split(",").index(column)
        cells = [row.split(",") for row in rows]
        for row in cells:
            row[at] = repr(float(row[at]) * factor)
        path.write_text("\n".join([header] + [",".join(row) for row in cells]) + "\n")


def test_a_night_whose_data_changed_is_stopped_at_validate_with_its_error_and_note(stack, rest):
    """(7c) The data gate under the scheduler: after a blessed night of the sharded DAG, a night whose
    ``pixel_20`` changed unit (x1000) fails at the validate task on its first try, train never starts, the
    task's log names the column and the measure, the run's note says the data was rejected against the
    production version, and no model version is added."""
    from tests.integration.test_sharded_prep import _split_digits

    dag_id = "tfpipe_stack_shards"
    parts, models = stack.volumes / "data" / "digits_parts", stack.volumes / "models" / dag_id

    def versions() -> list[str]:
        return sorted(p.name for p in models.iterdir() if p.name.isdigit()) if models.is_dir() else []

    if not parts.is_dir():
        _split_digits(stack.volumes)
    if not versions():  # the sharded test above blesses one; alone, this test makes its own baseline
        baseline = rest.trigger(dag_id)
        assert rest.wait_for_run(dag_id, baseline, timeout=480)["state"] == "success"
    before = versions()
    _scale_column(parts, "pixel_20", 1000.0)
    try:
        run_id = rest.trigger(dag_id)
        run = rest.wait_for_run(dag_id, run_id, timeout=480)
    finally:
        _scale_column(parts, "pixel_20", 0.001)
    tis = {t["task_id"]: t for t in rest.task_instances(dag_id, run_id) if t["map_index"] in (-1, None)}
    assert run["state"] == "failed", {k: v["state"] for k, v in tis.items()}
    assert (tis["validate"]["state"], tis["validate"]["try_number"]) == ("failed", 1)
    assert tis["train"]["state"] in ("upstream_failed", None), tis["train"]
    log = rest.task_log(dag_id, run_id, "validate", 1)
    assert "pixel_20" in log and "numeric_drift" in log and "accept_data_change" in log, log[-3000:]
    note = rest.run(dag_id, run_id)["note"]
    assert note and note.startswith(f"tfpipe: run failed at validate; data rejected vs v{before[-1]}: "), note
    assert "pixel_20 numeric_drift" in note
    assert versions() == before


def test_a_stage_in_of_many_objects_runs_in_a_celery_task(stack, rest, gcs_emulator, monkeypatch):
    """80 objects download in the transfer manager's threads of a Celery worker's task process (the
    stage-in alone, from the Cloud Storage emulator), onto the GPU host's data volume through the
    TLS engine. Every file arrives intact, owned by the stage's user."""
    from google.cloud import storage

    dag_id = "tfpipe_stack_stage_in"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    bucket = storage.Client(project="test").create_bucket(f"tfpipe-stack-{os.urandom(6).hex()}")
    bodies = {f"many/part-{i:03d}.bin": os.urandom(8192 + i) for i in range(80)}
    for name, body in bodies.items():
        bucket.blob(name).upload_from_string(body)
    target = stack.volumes / "data" / "stage_in_many"
    shutil.rmtree(target, ignore_errors=True)

    run_id = rest.trigger(dag_id, conf={"data_uri": f"gs://{bucket.name}/many/", "emulator": gcs_emulator})
    run = rest.wait_for_run(dag_id, run_id, timeout=300)
    log = rest.task_log(dag_id, run_id, "stage_in", 1)
    assert run["state"] == "success", log[-4000:]
    assert re.search(r"downloading 80 object\(s\), [\d.]+ MB, in \d+ threads", log), log[-4000:]
    assert rest.xcom(dag_id, run_id, "stage_in")["downloaded"] == len(bodies)
    for name, body in bodies.items():
        staged = target / name[len("many/"):]
        assert staged.read_bytes() == body, name
        assert (staged.stat().st_uid, staged.stat().st_gid) == (1000, 1000), name


def test_tls_engine_without_a_valid_client_certificate_fails_clearly_once(stack, rest):
    """(8) No client certificate, or one from a foreign CA: a clear error naming the engine and the fix, no retries."""
    foreign = stack.dir / "foreign-client"
    foreign.mkdir(exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=not signed by the stack CA", "-keyout", str(foreign / "key.pem"),
                    "-out", str(foreign / "cert.pem")], check=True, capture_output=True)
    os.chmod(foreign / "key.pem", 0o644)
    dag_id = "tfpipe_stack_bad_tls"
    t0 = time.monotonic()
    run_id = rest.trigger(dag_id)
    run = rest.wait_for_run(dag_id, run_id, timeout=240)
    assert run["state"] == "failed"
    for ti in rest.task_instances(dag_id, run_id):
        assert ti["state"] == "failed", ti
        assert ti["try_number"] == 1, f"{ti['task_id']} was retried (try {ti['try_number']})"
        text = rest.task_log(dag_id, run_id, ti["task_id"], 1)
        assert stack.engine_url in text, text[-3000:]
        assert "refused the TLS connection" in text and "Fix:" in text and "tls_client_cert" in text, text[-3000:]
    assert time.monotonic() - t0 < 240
