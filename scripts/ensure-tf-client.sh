#!/usr/bin/env bash
# Make sure .cache/tf-client is a venv of the machine's python3 (PYTHON) holding exactly
# requirements/tf-client.lock: a current TensorFlow that the export tests load the trainer image's
# SavedModels in, as a user's own serving code would (tests/tf_client.py). Reused while the lock's
# hash and the Python version are the ones it was built from; otherwise built again. Prints one
# line; exits non-zero naming the step that failed (with the end of its output).
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lock=$repo/requirements/tf-client.lock
venv=$repo/.cache/tf-client
python=${PYTHON:-python3}
# The venv is complete once this file holds the key it was built for: written last, so a build
# cut short is built again, never used.
stamp=$venv/.built-from

fail() {
  echo "ensure-tf-client: FAILED: $1" >&2
  # pip repeats a line per package for each index location it skips: noise, not the error
  [ -n "${2:-}" ] && [ -f "$2" ] && grep -v "^WARNING: Location" "$2" | tail -25 >&2
  exit 1
}

[ -f "$lock" ] || fail "$lock is missing"
command -v "$python" >/dev/null 2>&1 || fail "no $python on PATH (set PYTHON to a CPython 3 interpreter)"
python_version=$("$python" -c 'import platform; print(platform.python_version())') \
  || fail "$python does not run"
key="$(sha256sum "$lock" | cut -d' ' -f1) python-$python_version"
tf_pin=$(sed -n 's/^tensorflow[-_]cpu==//p' "$lock")

mkdir -p "$repo/.cache"
# Two callers at once (a test worker and make) would build into one directory: the second waits.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$repo/.cache/tf-client.build-lock"
  flock 9
fi

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then
  echo "ensure-tf-client: $venv is ready (tensorflow-cpu $tf_pin, Python $python_version)"
  exit 0
fi

log=$repo/.cache/tf-client.build.log
started=$(date +%s)
rm -rf "$venv"
"$python" -m venv "$venv" >"$log" 2>&1 \
  || fail "$python -m venv $venv did not make a venv (on Debian: apt-get install python3-venv)" "$log"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$lock" >>"$log" 2>&1 \
  || fail "pip could not install $lock into $venv: check that the package index answers and that \
tensorflow-cpu $tf_pin has a wheel for Python $python_version on $(uname -m) (log: $log)" "$log"
# Import it once: a wheel that installs but cannot load here (glibc, CPU instructions) fails now,
# with its own message, not in the middle of a test.
got=$(TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" -I -c 'import tensorflow as tf; print(tf.__version__)' 2>>"$log") \
  || fail "tensorflow $tf_pin installed into $venv but does not import (log: $log)" "$log"
[ "$got" = "$tf_pin" ] || fail "$venv imports tensorflow $got, the lock pins $tf_pin"
echo "$key" >"$stamp"
echo "ensure-tf-client: built $venv (tensorflow-cpu $tf_pin, Python $python_version) in $(($(date +%s) - started)) s"
