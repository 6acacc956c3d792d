#!/usr/bin/env bash
# Make sure a headless Chromium is available for the report screenshot test (tests/debug):
# as root on Debian/Ubuntu install Debian's `chromium`; otherwise say what to install.
# Never fails the build: without Chromium that one test skips with a reason.
set -uo pipefail

for name in chromium chromium-browser; do
  command -v "$name" >/dev/null 2>&1 && exit 0
done

if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: installing Debian's chromium (headless report screenshots; about a minute)" >&2
  if apt-get update -qq && DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get install -y -qq --no-install-recommends chromium >/dev/null; then
    exit 0
  fi
  echo "ensure-chromium: apt-get install chromium failed; the report screenshot test will skip" >&2
  exit 0
fi

cat >&2 <<'MSG'
ensure-chromium: no chromium on PATH; the report screenshot test (tests/debug) will skip.
To run it, install a headless Chromium:
  Debian:         sudo apt-get install -y chromium
  Ubuntu:         sudo snap install chromium   (the apt package is a snap wrapper)
  Fedora/RHEL:    sudo dnf install -y chromium
  macOS:          brew install --cask chromium
MSG
exit 0
