#!/usr/bin/env bash
# Make sure a Docker engine answers: start an installed one, or (as root on Debian/Ubuntu)
# install Debian's docker.io first. Otherwise say exactly what to install.
set -euo pipefail
log=${TFPIPE_DOCKERD_LOG:-/tmp/tfpipe-dockerd.log}

docker info >/dev/null 2>&1 && exit 0

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null; then
    echo "ensure-docker: installing Debian's docker.io" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  else
    cat >&2 <<'MSG'
ensure-docker: no Docker engine is running and dockerd is not installed.
Install Docker Engine (API >= 1.40, i.e. Docker 19.03 or newer):
  Debian/Ubuntu:  sudo apt-get install -y docker.io   (or Docker CE from docs.docker.com)
  Fedora/RHEL:    sudo dnf install -y moby-engine      (or Docker CE)
  macOS/Windows:  Docker Desktop
then start it (sudo systemctl start docker) and make sure `docker info` works for your user.
For GPUs also install the NVIDIA Container Toolkit.
MSG
    exit 1
  fi
fi

if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemctl start docker 2>/dev/null || true
fi
if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "ensure-docker: dockerd is installed but not running; start it: sudo systemctl start docker" >&2
    exit 1
  fi
  echo "ensure-docker: starting dockerd in the background (log: $log)" >&2
  setsid nohup dockerd >"$log" 2>&1 </dev/null &
fi
for _ in $(seq 1 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 1
done
echo "ensure-docker: dockerd did not answer within 60 s; see $log" >&2
tail -20 "$log" >&2 || true
exit 1
