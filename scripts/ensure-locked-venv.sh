#!/usr/bin/env bash
# Make sure .cache/<name> is a venv of the machine's python3 (PYTHON) holding exactly
# requirements/<name>.lock. Reused while the lock's hash and the Python version are the ones it was
# built from; otherwise built again. Prints one line; exits non-zero naming the step that failed
# (with the end of its output). The venvs that must stay out of Airflow's (whose pins they would
# fight) are built by it: scripts/ensure-tf-client.sh and scripts/ensure-mlflow-server.sh.
#
#   ensure-locked-venv.sh NAME PACKAGE PIN_PATTERN CHECK
#     PACKAGE      the package the one line names, e.g. tensorflow-cpu
#     PIN_PATTERN  a sed pattern of its name in the lock, e.g. 'tensorflow[-_]cpu'
#     CHECK        Python code run in the new venv that prints the package's version: a wheel that
#                  installs but cannot load here (glibc, CPU instructions) fails now, with its own
#                  message, not in the middle of a test or while a server is awaited
set -uo pipefail

name=${1:?usage: ensure-locked-venv.sh NAME PACKAGE PIN_PATTERN CHECK}
package=${2:?} pattern=${3:?} check=${4:?}
me=ensure-$name
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lock=$repo/requirements/$name.lock
venv=$repo/.cache/$name
python=${PYTHON:-python3}
# The venv is complete once this file holds the key it was built for: written last, so a build
# cut short is built again, never used.
stamp=$venv/.built-from

fail() {
  echo "$me: FAILED: $1" >&2
  # pip repeats a line per package for each index location it skips: noise, not the error
  [ -n "${2:-}" ] && [ -f "$2" ] && grep -v "^WARNING: Location" "$2" | tail -25 >&2
  exit 1
}

[ -f "$lock" ] || fail "$lock is missing"
command -v "$python" >/dev/null 2>&1 || fail "no $python on PATH (set PYTHON to a CPython 3 interpreter)"
python_version=$("$python" -c 'import platform; print(platform.python_version())') \
  || fail "$python does not run"
key="$(sha256sum "$lock" | cut -d' ' -f1) python-$python_version"
pin=$(sed -n "s/^${pattern}==//p" "$lock")

mkdir -p "$repo/.cache"
# Two callers at once (a test worker and make) would build into one directory: the second waits.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$repo/.cache/$name.build-lock"
  flock 9
fi

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then
  echo "$me: $venv is ready ($package $pin, Python $python_version)"
  exit 0
fi

log=$repo/.cache/$name.build.log
started=$(date +%s)
rm -rf "$venv"
"$python" -m venv "$venv" >"$log" 2>&1 \
  || fail "$python -m venv $venv did not make a venv (on Debian: apt-get install python3-venv)" "$log"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$lock" >>"$log" 2>&1 \
  || fail "pip could not install $lock into $venv: check that the package index answers and that \
$package $pin has wheels for Python $python_version on $(uname -m) (log: $log)" "$log"
got=$(TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" -I -c "$check" 2>>"$log") \
  || fail "$package $pin installed into $venv but does not import (log: $log)" "$log"
[ "$got" = "$pin" ] || fail "$venv imports $package $got, the lock pins $pin"
echo "$key" >"$stamp"
echo "$me: built $venv ($package $pin, Python $python_version) in $(($(date +%s) - started)) s"
