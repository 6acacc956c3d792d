#!/usr/bin/env bash
# Make sure .cache/mlflow-server is a venv of the machine's python3 (PYTHON) holding exactly
# requirements/mlflow-server.lock: the MLflow tracking server that `make up` runs beside Airflow
# (deploy/stack.py) and the MLflow tests start. The full mlflow package (Flask, SQLAlchemy, alembic,
# pandas) stays out of Airflow's venv, whose own pins it would fight. Reused while the lock's hash and
# the Python version are the ones it was built from; otherwise built again. Prints one line; exits
# non-zero naming the step that failed (with the end of its output).
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lock=$repo/requirements/mlflow-server.lock
venv=$repo/.cache/mlflow-server
python=${PYTHON:-python3}
# The venv is complete once this file holds the key it was built for: written last, so a build
# cut short is built again, never used.
stamp=$venv/.built-from

fail() {
  echo "ensure-mlflow-server: FAILED: $1" >&2
  # pip repeats a line per package for each index location it skips: noise, not the error
  [ -n "${2:-}" ] && [ -f "$2" ] && grep -v "^WARNING: Location" "$2" | tail -25 >&2
  exit 1
}

[ -f "$lock" ] || fail "$lock is missing"
command -v "$python" >/dev/null 2>&1 || fail "no $python on PATH (set PYTHON to a CPython 3 interpreter)"
python_version=$("$python" -c 'import platform; print(platform.python_version())') \
  || fail "$python does not run"
key="$(sha256sum "$lock" | cut -d' ' -f1) python-$python_version"
mlflow_pin=$(sed -n 's/^mlflow==//p' "$lock")

mkdir -p "$repo/.cache"
# Two callers at once (a test worker and make up) would build into one directory: the second waits.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$repo/.cache/mlflow-server.build-lock"
  flock 9
fi

if [ -x "$venv/bin/mlflow" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then
  echo "ensure-mlflow-server: $venv is ready (mlflow $mlflow_pin, Python $python_version)"
  exit 0
fi

log=$repo/.cache/mlflow-server.build.log
started=$(date +%s)
rm -rf "$venv"
"$python" -m venv "$venv" >"$log" 2>&1 \
  || fail "$python -m venv $venv did not make a venv (on Debian: apt-get install python3-venv)" "$log"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$lock" >>"$log" 2>&1 \
  || fail "pip could not install $lock into $venv: check that the package index answers and that \
mlflow $mlflow_pin has wheels for Python $python_version on $(uname -m) (log: $log)" "$log"
# Import the server's stack once: a wheel that installs but cannot load here fails now, with its
# own message, not when `make up` waits for the server to answer.
got=$("$venv/bin/python" -I -c 'import mlflow, mlflow.server, psycopg2; print(mlflow.__version__)' 2>>"$log") \
  || fail "mlflow $mlflow_pin installed into $venv but does not import (log: $log)" "$log"
[ "$got" = "$mlflow_pin" ] || fail "$venv imports mlflow $got, the lock pins $mlflow_pin"
echo "$key" >"$stamp"
echo "ensure-mlflow-server: built $venv (mlflow $mlflow_pin, Python $python_version) in $(($(date +%s) - started)) s"
