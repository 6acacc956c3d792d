"""The plugin on every supported Airflow release: links, report, login, TensorBoard and run note.

``tests/ui/test_plugin.py`` proves the plugin in depth on the newest release. This module runs on
each release in ``make test-compat`` (the oldest in every ``make test``) and checks what a user of
that release clicks: a real run of a small DAG through ``tfpipe run``, then ``airflow api-server``
of that release on its metadata DB, with the simple auth manager. Where the release has multi-team
mode (3.2 on), the DAG folder's bundle belongs to a team, as in ``tests/ui``, so that a viewer of
another team is refused; 3.0 and 3.1 have no teams, and there the simple auth manager's roles
grant every DAG to every user.
"""

from __future__ import annotations

import json
import os
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest

from tests.airflow_servers import (
    QUICK_BLESSED,
    ApiServer,
    create_teams,
    has_multi_team,
    multi_team_settings,
    release_home,
    remove_tensorboards,
)
from tests.conftest import run_dag

pytestmark = [pytest.mark.integration, pytest.mark.compat, pytest.mark.older_releases]

DAG_ID = "tfpipe_ui_release"
STAGES_WITH_LINKS = ("train", "evaluate", "export")


@pytest.fixture(scope="module")
def served(tmp_path_factory, trainer_image):
    """A finished run of a small tfpipe DAG and the release's api-server on its metadata DB."""
    import airflow

    root = tmp_path_factory.mktemp("plugin-release")
    home, dags, settings = release_home(root, DAG_ID, "admin:admin,mlviewer:viewer,outsider:viewer",
                                        **QUICK_BLESSED)
    teams = has_multi_team()
    if teams:
        settings.update(multi_team_settings(dags))
        create_teams({**os.environ, **settings})
    summary, log = run_dag(DAG_ID, {}, home=home, image=trainer_image, dags_folder=dags, extra_env=settings)
    (root / "run.log").write_text(log)  # beside the api-server's log, for a failure's reader
    assert summary["state"] == "success", log[-8000:]
    server = ApiServer({**os.environ, **settings}, root / "api-server.log")
    try:
        yield {"summary": summary, "server": server, "release": airflow.__version__, "teams": teams}
    finally:
        server.stop()
        remove_tensorboards(DAG_ID, summary["run_id"])


def _run_path(summary: dict) -> str:
    return f"/tfpipe/runs/{DAG_ID}/{quote(summary['run_id'], safe='')}"


def test_the_stage_tasks_extra_links_lead_to_the_plugin(served):
    server, summary = served["server"], served["summary"]
    run = quote(summary["run_id"], safe="")
    for task in STAGES_WITH_LINKS:
        status, _, body = server.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run}/taskInstances/{task}/links",
                                     user="mlviewer")
        assert status == 200, f"{served['release']}: {body[:500]!r}"
        answer = json.loads(body)
        links = answer.get("extra_links", answer)  # 3.0 wraps them with a count; later releases do not
        assert {"Run report", "TensorBoard"} <= set(links), f"{served['release']}, {task}: {links}"
        assert links["Run report"].endswith(f"{_run_path(summary)}/report/"), links
        assert links["TensorBoard"].endswith(f"{_run_path(summary)}/tensorboard/"), links


def test_the_report_is_served_through_the_plugin_with_airflow_s_login(served):
    server, summary = served["server"], served["summary"]
    report = f"{_run_path(summary)}/report/"
    status, headers, body = server.get(report, user="mlviewer")
    assert status == 200, f"{served['release']}: {body[:500]!r}"
    assert headers["content-type"].startswith("text/html")
    page = body.decode()
    assert summary["run_id"] in page and "data:image/png;base64," in page
    status, headers, png = server.get(report + "loss.png", user="mlviewer")
    assert status == 200 and headers["content-type"] == "image/png" and png.startswith(b"\x89PNG\r\n\x1a\n")
    # no credentials: 401 for an API client, the release's login page for a browser
    assert server.get(report)[0] == 401
    status, headers, _ = server.get(report, headers={"Accept": "text/html"})
    assert status in (302, 307) and "/auth/login" in headers["location"], (status, headers)
    back = parse_qs(urlsplit(headers["location"]).query).get("next", [])  # and back to the report
    assert [unquote(urlsplit(url).path) for url in back] == [unquote(report)], (served["release"], headers["location"])


def test_the_plugin_lets_in_exactly_whom_airflow_s_own_api_lets_read_the_run(served):
    """Where the release has teams, ``outsider`` (a viewer of another team) is refused by Airflow's
    run endpoint and by every plugin route; on 3.0 and 3.1 every role reads every DAG, and the
    plugin lets every user in as Airflow does."""
    server, summary = served["server"], served["summary"]
    run = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(summary['run_id'], safe='')}"
    for user in ("admin", "mlviewer", "outsider"):
        expected = 403 if user == "outsider" and served["teams"] else 200
        assert server.get(run, user=user)[0] == expected, f"{served['release']}: Airflow's answer to {user}"
        for path in ("report/", "report/loss.png"):
            status, _, body = server.get(f"{_run_path(summary)}/{path}", user=user)
            assert status == expected, f"{served['release']}, {user}, {path}: {status} {body[:300]!r}"
    if served["teams"]:  # refused before any TensorBoard starts (the next test starts one)
        assert server.get(f"{_run_path(summary)}/tensorboard/", user="outsider")[0] == 403


def test_tensorboard_is_started_on_demand_behind_the_login(served, docker_client):
    from tfpipe.plugins.run_access import TENSORBOARD_ROLE

    server, summary = served["server"], served["summary"]
    base = f"{_run_path(summary)}/tensorboard/"
    assert server.get(base)[0] == 401
    status, headers, body = server.get(base, user="mlviewer")
    assert status == 200, f"{served['release']}: {body[:1000]!r}"
    assert headers["content-type"].startswith("text/html") and b"TensorBoard" in body
    status, _, body = server.get(base + "data/runs", user="mlviewer")
    assert status == 200 and json.loads(body), f"{served['release']}: TensorBoard found no event files: {body[:500]!r}"
    found = docker_client.api.containers(filters={"label": [f"tfpipe.role={TENSORBOARD_ROLE}",
                                                            f"tfpipe.tensorboard={DAG_ID}/{summary['run_id']}"]})
    assert len(found) == 1, found


def test_the_run_note_summarises_the_run(served):
    server, summary = served["server"], served["summary"]
    status, _, body = server.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(summary['run_id'], safe='')}",
                                 user="admin")
    assert status == 200, body[:500]
    note = json.loads(body)["note"]
    assert note is not None, f"{served['release']}: no run note"
    assert note.startswith(f"tfpipe: blessed, accuracy {summary['metrics']['accuracy']:.4f} >= threshold 0.5000"), note
    assert f"model {DAG_ID} v1" in note and "train 1 try" in note
