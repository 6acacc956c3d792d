#!/usr/bin/env bash
# Make sure a headless Chromium is available for the report rendering test (tests/debug):
# as root on Debian/Ubuntu install Debian's `chromium`; otherwise say what to install.
# Exits non-zero when no Chromium can be had, so `make test` stops here with the reason
# instead of running a suite whose report test could not run.
set -uo pipefail

for name in chromium chromium-browser; do
  command -v "$name" >/dev/null 2>&1 && exit 0
done

if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: installing Debian's chromium (headless report rendering test; about a minute)" >&2
  if apt-get update -qq && DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get install -y -qq --no-install-recommends chromium >/dev/null \
      && command -v chromium >/dev/null 2>&1; then
    exit 0
  fi
  echo "ensure-chromium: FAILED: apt-get install chromium did not give a chromium on PATH (output above)." >&2
  exit 1
fi

cat >&2 <<'MSG'
ensure-chromium: FAILED: no chromium on PATH and it cannot be installed from here (not root on
Debian). The test suite renders the run report in headless Chromium; install one, then rerun:
  Debian:         sudo apt-get install -y chromium
  Ubuntu:         sudo snap install chromium   (the apt package is a snap wrapper)
  Fedora/RHEL:    sudo dnf install -y chromium
  macOS:          brew install --cask chromium
MSG
exit 1
