#!/usr/bin/env bash
# Run the trainer tests inside the trainer image, with the working tree mounted read-only.
#
#   tests/trainer/run-in-image.sh [pytest args...]     e.g.  -m resume   or   -k "not integration"
#   tests/trainer/run-in-image.sh tests/trainer/test_prep.py -x     (paths relative to the repo)
#
# The image comes from docker/build-image.sh (built or reused). Tests run as the image's user
# (uid 1000) and write only under pytest's tmp_path inside the container. --confcutdir keeps the
# host suite's tests/conftest.py (Airflow set-up) out of the image. Exits with pytest's code.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
image=$("$repo/docker/build-image.sh")
# /src goes first on the image's own PYTHONPATH (which holds the locked packages), so the
# mounted trainer/ shadows the copy baked into the image.
image_path=$(docker image inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$image" \
  | sed -n 's/^PYTHONPATH=//p')
# Test paths given (tests/trainer/test_x.py, ...::test_y) replace the default tests/trainer.
target=(tests/trainer)
for arg in "$@"; do
  case $arg in tests/*) target=() ;; esac
done
tty=()
[ -t 1 ] && tty=(-t)
# An engine with the NVIDIA runtime gets the GPUs passed in, so the gpu-marked tests run there
# (TFPIPE_TEST_GPUS=none keeps them out, e.g. to compare with a CPU run).
gpus=()
if [ "${TFPIPE_TEST_GPUS:-all}" != none ] && docker info --format '{{json .Runtimes}}' | grep -q '"nvidia"'; then
  gpus=(--gpus "${TFPIPE_TEST_GPUS:-all}")
  echo "run-in-image: the engine has an NVIDIA runtime: passing --gpus ${TFPIPE_TEST_GPUS:-all}" >&2
fi
exec docker run --rm "${tty[@]}" "${gpus[@]}" -v "$repo:/src:ro" -w /src \
  -e PYTHONPATH="/src${image_path:+:$image_path}" -e HOME=/tmp \
  "$image" python3 -m pytest -p no:cacheprovider --confcutdir=tests/trainer -q "${target[@]}" "$@"
