#!/usr/bin/env bash
# For the day a GPU host is at hand: run every GPU path of tfpipe against this host's Docker engine
# and print one summary.
#
#   scripts/gpu-check.sh
#
# Runs, in order: the gpu-marked trainer tests inside the image (`make test-trainer`, which passes
# --gpus all when the engine has the NVIDIA runtime), the gpu-marked host tests through Airflow
# (`make test-host`). Exits 0 only when both ran and passed. A skipped GPU test
# counts as a failure here: on a GPU host every one of them must run.
#
# Without an NVIDIA runtime on the engine it says so and exits 1 at once: nothing here can stand
# in for a GPU. Either image root works: the offline Debian root carries NVIDIA's CUDA 11 runtime
# wheels (the image guide), the official tensorflow/tensorflow:2.9.3-gpu root its own
# CUDA 11.2; the variant must not be TFPIPE_IMAGE_VARIANT=cpu. The driver comes from the host.
set -uo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-docker.sh || { echo "gpu-check: no Docker engine answers" >&2; exit 1; }
runtimes=$(docker info --format '{{json .Runtimes}}' 2>/dev/null || echo '{}')
if ! grep -q '"nvidia"' <<<"$runtimes"; then
  cat >&2 <<MSG
gpu-check: NOT RUN: the Docker engine has no NVIDIA runtime (runtimes: $runtimes).
No GPU path was exercised on this host. Install the NVIDIA driver and the NVIDIA Container Toolkit
(nvidia-ctk runtime configure --runtime=docker; restart dockerd), then run this script again.
MSG
  exit 1
fi

log_dir=.cache/gpu-check
mkdir -p "$log_dir"
declare -A status
# pytest's summary line, e.g. "3 passed, 1 skipped in 40.1s"; a skip or no test at all is a failure
judge() {  # name logfile exit-code
  local summary
  summary=$(grep -E '[0-9]+ (passed|failed|skipped|error|errors|deselected)' "$2" | tail -1 | sed 's/\x1b\[[0-9;]*m//g; s/=//g')
  if [ "$3" -ne 0 ]; then status[$1]="FAILED (exit $3): $summary"
  elif grep -qE '[0-9]+ skipped' <<<"$summary" || ! grep -qE '[0-9]+ passed' <<<"$summary"; then
    status[$1]="FAILED (a GPU test skipped or none ran): $summary"
  else status[$1]="ok: $summary"; fi
}

echo "gpu-check: NVIDIA runtime found; logs in $log_dir" >&2
make test-trainer PYTEST_ARGS="-m gpu -rs" >"$log_dir/trainer.log" 2>&1; judge trainer "$log_dir/trainer.log" $?
make test-host PYTEST_ARGS="-m gpu -rs" >"$log_dir/host.log" 2>&1; judge host "$log_dir/host.log" $?

echo
echo "gpu-check summary ($(date -u +%Y-%m-%dT%H:%MZ), image $(cat .cache/trainer-image 2>/dev/null || echo '?')):"
failed=0
for name in trainer host; do
  printf '  %-8s %s\n' "$name" "${status[$name]}"
  [[ ${status[$name]} == ok:* ]] || failed=1
done
exit $failed
