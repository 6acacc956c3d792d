#!/usr/bin/env bash
# Unmount every file system mounted at or under DIR, deepest first; exit 1 naming any that stays.
#
#   docker/unmount-under.sh DIR
#
# debootstrap mounts /proc (and /sys, /dev/pts where the host allows) inside its target and
# unmounts them on exit, but it ignores an unmount that fails there. One left behind makes `tar`
# archive the host's /proc into the root image (every process's environment included) and makes
# `rm -rf` of the target try to delete it, so build-image.sh calls this before either.
set -euo pipefail

[ $# = 1 ] || { echo "usage: docker/unmount-under.sh DIR" >&2; exit 2; }
[ -d "$1" ] || exit 0
dir=$(cd "$1" && pwd -P)

# /proc/self/mounts writes a space in a path as \040; a mount point is listed once per mount.
mounted() {
  awk -v d="$dir" '{ p = $2; gsub(/\\040/, " ", p); if (p == d || index(p, d "/") == 1) print p }' /proc/self/mounts \
    | LC_ALL=C sort -r -u
}

# A point mounted over twice is listed once: a few rounds unmount the stack.
for _ in 1 2 3 4 5; do
  points=$(mounted)
  [ -n "$points" ] || exit 0
  while IFS= read -r point; do
    umount "$point" 2>/dev/null || umount -l "$point" 2>/dev/null || true
  done <<<"$points"
done

left=$(mounted)
if [ -n "$left" ]; then
  printf 'unmount-under: error: still mounted under %s: %s. Fix: umount them (as root) and rerun\n' \
    "$dir" "$(printf '%s' "$left" | tr '\n' ' ')" >&2
  exit 1
fi
