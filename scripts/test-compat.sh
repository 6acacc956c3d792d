#!/usr/bin/env bash
# The provider's tests on one Airflow 3 release, in a virtualenv of its own.
#
#   scripts/test-compat.sh AIRFLOW_VERSION [pytest args...]      (make test-compat AIRFLOW_VERSION=X.Y.Z)
#   scripts/test-compat.sh --prepare AIRFLOW_VERSION             (the venv and DB only, no tests)
#
# The virtualenv .venv-airflow-X.Y.Z is built from that release's lock, requirements/airflow-X.Y.lock
# (exact pins, so a run today and a run next year install the same thing), and reused while the lock
# and pyproject.toml are unchanged. Airflow's metadata DB for that release lives apart from the main
# one (.cache/airflow-home-X.Y.Z): each release has its own schema. Then, with that venv's Python:
# every test not marked `integration` (provider unit tests, the DagBag import check of every dags/
# file), plus the integration tests marked `compat` (a whole tfpipe_digits run with real containers
# and a second one on the same data, a resume after a container kill, a re-run after a worker kill). The trainer
# image and the data set come from `make image data`.
set -euo pipefail
cd "$(dirname "$0")/.."

# --prepare builds what the tests need and stops: `make test` builds the venv (pip keeps about one
# core busy) beside the trainer suite, which leaves part of the other idle, not after the host suite.
prepare=0
if [[ ${1:-} == --prepare ]]; then
  prepare=1
  shift
fi
version=${1:?usage: scripts/test-compat.sh [--prepare] AIRFLOW_VERSION [pytest args...]}
shift
PYTHON=${PYTHON:-python3}
supported() { sed -n 's/^apache-airflow==//p' requirements/airflow-*.lock | sort -V | paste -sd' '; }

minor=$(cut -d. -f1,2 <<<"$version")
lock=requirements/airflow-$minor.lock
if [[ ! -f $lock ]]; then
  echo "test-compat: no lock for Airflow $minor ($lock). Fix: AIRFLOW_VERSION= one of: $(supported)" >&2
  exit 2
fi
pinned=$(sed -n 's/^apache-airflow==//p' "$lock")
if [[ $pinned != "$version" ]]; then
  echo "test-compat: $lock pins apache-airflow $pinned, not $version. Fix: AIRFLOW_VERSION=$pinned" \
       "(supported: $(supported))" >&2
  exit 2
fi

started=$SECONDS
venv=$PWD/.venv-airflow-$version
if [[ ! -f $venv/.installed || $lock -nt $venv/.installed || pyproject.toml -nt $venv/.installed ]]; then
  echo "[compat $version] creating $venv from $lock"
  test -x "$venv/bin/python" || "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$lock" 2> >(grep -v "^WARNING: Location" >&2)
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e . \
    2> >(grep -v "^WARNING: Location" >&2)
  rm -rf provider/*.egg-info  # a second copy of the metadata on sys.path: see the Makefile's venv target
  touch "$venv/.installed"
  echo "[compat $version] venv ready in $((SECONDS - started)) s"
fi

export AIRFLOW_HOME=$PWD/.cache/airflow-home-$version
# A DB named by the caller's environment (a pytest worker's copy, a user's own Airflow) would
# otherwise win over AIRFLOW_HOME, and this release's migration would run against it.
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=sqlite:///$AIRFLOW_HOME/airflow.db
export PATH=$venv/bin:$PATH  # Airflow starts its parts as `airflow ...` subprocesses
if [[ ! -f $AIRFLOW_HOME/.migrated || $venv/.installed -nt $AIRFLOW_HOME/.migrated ]]; then
  mkdir -p "$AIRFLOW_HOME"
  airflow db migrate >"$AIRFLOW_HOME/migrate.log" 2>&1 || { tail -30 "$AIRFLOW_HOME/migrate.log"; exit 1; }
  touch "$AIRFLOW_HOME/.migrated"
fi
if ((prepare)); then
  echo "[compat $version] venv and metadata DB ready ($((SECONDS - started)) s)"
  exit 0
fi

tests_started=$SECONDS
echo "[compat $version] tests: unit, DagBag, two tfpipe_digits runs (the second a prep cache hit), one resume after a killed container, one re-run after a killed worker, the plugin through the api-server, one run by the scheduler, one by a Celery worker on PostgreSQL"
# The same pytest-xdist flags as make test-host: make passes its XDIST_ARGS (from TEST_WORKERS);
# run directly without them, the tests run in this one process.
read -r -a xdist <<<"${XDIST_ARGS:-}"
status=0
"$venv/bin/python" -m pytest -q -p no:cacheprovider -m "(not integration or compat) and not docs" "${xdist[@]}" "$@" || status=$?
echo "[compat $version] Airflow $("$venv/bin/python" -c 'import airflow; print(airflow.__version__)'):" \
     "tests $((SECONDS - tests_started)) s, all $((SECONDS - started)) s, exit $status"
exit $status
