#!/usr/bin/env bash
# Build (or reuse) the tfpipe trainer image and print its reference on stdout.
#
#   root image  : tensorflow/tensorflow:2.9.3-gpu when it can be pulled, else an offline
#                 Debian bullseye rootfs (Python 3.9) made with debootstrap and `docker import`
#   deps image  : root + the wheels pinned by docker/requirements.lock   (docker/deps.Dockerfile)
#   trainer     : deps + trainer/                                          (docker/Dockerfile)
#
# Every tag is derived from content, so an image is rebuilt exactly when its inputs change and a
# stale image is never used. Progress goes to stderr; stdout carries only the final reference.
#
# Environment:
#   TFPIPE_ROOT_IMAGE   force a root image (e.g. tensorflow/tensorflow:2.9.3-gpu@sha256:...);
#                       "offline" forces the bullseye build.
#   TFPIPE_OFFICIAL_IMAGE  the official root tried first (default tensorflow/tensorflow:2.9.3-gpu).
#   DEBIAN_MIRROR       mirror for debootstrap (default: the first Debian URI in apt's sources).
#   TFPIPE_CACHE        where wheelhouses and the rootfs are kept (default: <repo>/.cache).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cache=${TFPIPE_CACHE:-$repo/.cache}
official=${TFPIPE_OFFICIAL_IMAGE:-tensorflow/tensorflow:2.9.3-gpu}
start=$SECONDS

say() { printf '[image %3ds] %s\n' "$((SECONDS - start))" "$*" >&2; }
die() { printf 'build-image: error: %s\n' "$*" >&2; exit 1; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }
sha() { sha256sum | cut -c1-12; }

docker info >/dev/null 2>&1 || die "no Docker engine answers (run 'make docker' or start dockerd)"

# --- 1. the root image -------------------------------------------------------------------------
root_choice=${TFPIPE_ROOT_IMAGE:-}
if [ -z "$root_choice" ]; then
  if have_image "$official" || timeout 600 docker pull -q "$official" >/dev/null 2>&1; then
    root_choice=$official
  else
    root_choice=offline
  fi
fi

if [ "$root_choice" = offline ]; then
  suite=bullseye
  rootfs_recipe="debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates $suite"
  root_image="tfpipe/rootfs-$suite:$(printf '%s' "$rootfs_recipe" | sha)"
  pyver=3.9
  say "root: offline $suite rootfs ($official could not be pulled) -> $root_image"
  if ! have_image "$root_image"; then
    if ! command -v debootstrap >/dev/null; then
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing debootstrap (apt-get)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap) >/dev/null \
          || die "apt-get install debootstrap failed"
      else
        die "debootstrap is missing: sudo apt-get install -y debootstrap (needed to build the offline base)"
      fi
    fi
    mirror=${DEBIAN_MIRROR:-}
    if [ -z "$mirror" ]; then
      mirror=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
                 /etc/apt/sources.list.d/*.list 2>/dev/null | grep -v -- -security | grep -m1 -i debian \
                 | awk '{print $2}') || true
    fi
    [ -n "$mirror" ] || die "no Debian mirror found in apt's sources: set DEBIAN_MIRROR"
    rootfs="$cache/rootfs-$suite"
    rm -rf "$rootfs"
    mkdir -p "$rootfs"
    say "debootstrap $suite (about a minute)"
    # shellcheck disable=SC2086
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
      "$suite" "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 \
      || die "debootstrap failed: see $cache/debootstrap.log"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    say "docker import -> $root_image"
    tar -C "$rootfs" -c . | docker import - "$root_image" >/dev/null
    rm -rf "$rootfs"
  fi
else
  root_image=$root_choice
  say "root: $root_image"
  have_image "$root_image" || docker pull -q "$root_image" >/dev/null || die "cannot pull $root_image"
  pyver=$(docker run --rm --entrypoint python3 "$root_image" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
fi
root_id=$(docker image inspect -f '{{.Id}}' "$root_image" | cut -c8-19)

# --- 2. the dependency image -------------------------------------------------------------------
deps_image="tfpipe/tf29-deps:$(cat "$here/requirements.lock" "$here/deps.Dockerfile" \
  | { cat; printf '%s %s' "$root_id" "$pyver"; } | sha)"
if have_image "$deps_image"; then
  say "deps: $deps_image (cached)"
else
  wheels="$cache/wheelhouse-py$pyver"
  say "deps: downloading the locked wheels for Python $pyver into $wheels"
  mkdir -p "$wheels"
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$pyver" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2010_x86_64 --platform manylinux_2_12_x86_64 \
    --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
    -r "$here/requirements.lock" -d "$wheels" 2> >(grep -v "^WARNING: Location" >&2) \
    || die "pip download of docker/requirements.lock failed (is the package index reachable?)"
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  cp "$here/requirements.lock" "$ctx/"
  ln "$wheels"/*.whl "$ctx/" 2>/dev/null || cp "$wheels"/*.whl "$ctx/"
  mkdir "$ctx/wheels" && mv "$ctx"/*.whl "$ctx/wheels/"
  say "deps: docker build $deps_image (about a minute)"
  DOCKER_BUILDKIT=0 docker build -q --build-arg "ROOT_IMAGE=$root_image" \
    -f "$here/deps.Dockerfile" -t "$deps_image" "$ctx" 2> >(grep -v -e DEPRECATED -e BuildKit -e '^ *environment-variable' -e '^$' >&2) >/dev/null \
    || die "building $deps_image failed"
  # The legacy builder keeps the throw-away install stage as a dangling image: drop it.
  docker image prune -f --filter label=io.tfpipe.stage=install >/dev/null || true
fi

# --- 3. the trainer image ----------------------------------------------------------------------
code_id=$( { cat "$here/Dockerfile"; printf '%s\n' "$deps_image";
             cd "$repo" && find trainer -type f -name '*.py' | LC_ALL=C sort | xargs cat; } | sha)
image="tfpipe/trainer:$code_id"
if have_image "$image"; then
  say "trainer: $image (cached)"
else
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  (cd "$repo" && find trainer -type f -name '*.py' -print0 | tar -c --null -T - | tar -C "$ctx" -x)
  say "trainer: docker build $image"
  DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE_IMAGE=$deps_image" \
    --build-arg "TFPIPE_IMAGE_ID=$code_id" -f "$here/Dockerfile" -t "$image" "$ctx" \
    2> >(grep -v -e DEPRECATED -e BuildKit -e '^ *environment-variable' -e '^$' >&2) >/dev/null \
    || die "building $image failed"
fi
mkdir -p "$cache"
printf '%s\n' "$image" >"$cache/trainer-image"
say "ready: $image"
printf '%s\n' "$image"
