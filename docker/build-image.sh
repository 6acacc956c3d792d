#!/usr/bin/env bash
# Build (or reuse) the tfpipe trainer image and print its reference on stdout.
#
#   root image  : tensorflow/tensorflow:2.9.3-gpu when it can be pulled, else an offline
#                 Debian bullseye rootfs (Python 3.9) made with debootstrap and `docker import`
#   deps image  : root + the wheels pinned by docker/requirements.lock   (docker/deps.Dockerfile)
#   trainer     : deps + trainer/                                          (docker/Dockerfile)
#   variants    : gpu (default, CUDA 11 runtime wheels inside) or cpu (TFPIPE_IMAGE_VARIANT=cpu)
#
# Every tag is derived from content, so an image is rebuilt exactly when its inputs change and a
# stale image is never used. Progress goes to stderr; stdout carries only the final reference.
#
#   docker/build-image.sh --plan   builds nothing: prints "<layer> <tag> present|absent" for the
#                                  root, deps and trainer images the inputs ask for (the root must
#                                  be there: the deps tag hashes its id).
#
# Environment:
#   TFPIPE_ROOT_IMAGE   force a root image (e.g. tensorflow/tensorflow:2.9.3-gpu@sha256:...);
#                       "offline" forces the bullseye build.
#   TFPIPE_IMAGE_VARIANT  gpu (default): with NVIDIA's CUDA 11 runtime wheels (about 3 GB more);
#                       cpu: every nvidia- line of the lock left out, for CPU-only hosts.
#   TFPIPE_OFFICIAL_IMAGE  the official root tried first (default tensorflow/tensorflow:2.9.3-gpu).
#   DEBIAN_MIRROR       mirror for debootstrap (default: the first Debian URI in apt's sources).
#   TFPIPE_CACHE        where wheelhouses and the rootfs are kept (default: <repo>/.cache).
set -euo pipefail

plan=0
case ${1:-} in
  --plan) plan=1 ;;
  '') ;;
  *) printf 'build-image: error: unknown argument %s. Usage: docker/build-image.sh [--plan]\n' "$1" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cache=${TFPIPE_CACHE:-$repo/.cache}
official=${TFPIPE_OFFICIAL_IMAGE:-tensorflow/tensorflow:2.9.3-gpu}
variant=${TFPIPE_IMAGE_VARIANT:-gpu}
start=$SECONDS

say() { printf '[image %3ds] %s\n' "$((SECONDS - start))" "$*" >&2; }
die() { printf 'build-image: error: %s\n' "$*" >&2; exit 1; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }
# --plan: one line per layer on stdout, nothing built.
planned() { if have_image "$2"; then echo "$1 $2 present"; else echo "$1 $2 absent"; fi; }
sha() { sha256sum | cut -c1-12; }
debian_mirror() {
  local mirror=${DEBIAN_MIRROR:-}
  if [ -z "$mirror" ]; then
    mirror=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
               /etc/apt/sources.list.d/*.list 2>/dev/null | grep -v -- -security | grep -m1 -i debian \
               | awk '{print $2}') || true
  fi
  [ -n "$mirror" ] || die "no Debian mirror found in apt's sources: set DEBIAN_MIRROR"
  printf '%s\n' "${mirror%/}"
}

# The lock of this variant: the cpu variant leaves every CUDA wheel out.
variant_lock() {
  if [ "$variant" = cpu ]; then grep -v '^nvidia-' "$here/requirements.lock"; else cat "$here/requirements.lock"; fi
}
# Download the variant's locked wheels for Python $1 into the cache's wheelhouse (pip skips wheels
# already there). One pip per large CUDA wheel, beside one for the rest: a single connection to the
# index is the bottleneck, so parallel downloads fill the line.
fetch_wheels() {
  local pyver=$1 wheels="$cache/wheelhouse-py$1" lock req pid pids=()
  lock=$(variant_lock)
  mkdir -p "$wheels"
  download() {
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version "$pyver" --implementation cp \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2010_x86_64 --platform manylinux_2_12_x86_64 \
      --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
      -d "$wheels" "$@" 2> >(grep -v "^WARNING: Location" >&2)
  }
  download -r <(printf '%s\n' "$lock" | grep -v -e '^nvidia-' -e '^#' -e '^$') & pids+=($!)
  for req in $(printf '%s\n' "$lock" | grep '^nvidia-'); do
    download "$req" & pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || return 1
  done
}

case $variant in gpu|cpu) ;; *) die "TFPIPE_IMAGE_VARIANT=$variant: must be gpu or cpu. Fix: unset it (gpu) or set cpu" ;; esac
docker info >/dev/null 2>&1 || die "no Docker engine answers (run 'make docker' or start dockerd)"

# --- 1. the root image -------------------------------------------------------------------------
root_choice=${TFPIPE_ROOT_IMAGE:-}
if [ -z "$root_choice" ]; then
  # --plan pulls nothing: it plans with the official root only when that is already here.
  if have_image "$official" || { [ "$plan" = 0 ] && timeout 600 docker pull -q "$official" >/dev/null 2>&1; }; then
    root_choice=$official
  else
    root_choice=offline
  fi
fi

if [ "$root_choice" = offline ]; then
  suite=bullseye
  # libjemalloc2 replaces glibc malloc in the stage containers; tzdata makes TZ work.
  packages=python3,python3-pip,python3-venv,ca-certificates,libjemalloc2,tzdata
  rootfs_recipe="debootstrap --variant=minbase --include=$packages $suite"
  root_image="tfpipe/rootfs-$suite:$(printf '%s' "$rootfs_recipe" | sha)"
  pyver=3.9
  say "root: offline $suite rootfs ($official could not be pulled) -> $root_image"
  if [ "$plan" = 1 ] && ! have_image "$root_image"; then
    planned root "$root_image"
    die "--plan: the root image $root_image is not built, and the deps tag hashes its id: run 'make image'"
  fi
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
    # A new root means a new deps image, so its wheels are needed: download them (network) while
    # debootstrap unpacks (mostly disk and CPU) instead of after it.
    say "deps: downloading the $variant variant's locked wheels for Python $pyver (beside debootstrap)"
    fetch_wheels "$pyver" & prefetch=$!
    mirror=$(debian_mirror)
    rootfs="$cache/rootfs-$suite"
    "$here/unmount-under.sh" "$rootfs"  # what an interrupted build's debootstrap left mounted
    rm -rf "$rootfs"
    mkdir -p "$rootfs"
    say "debootstrap $suite (about a minute)"
    # shellcheck disable=SC2086
    debootstrap --variant=minbase --include="$packages" \
      "$suite" "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 \
      || { "$here/unmount-under.sh" "$rootfs"; die "debootstrap failed: see $cache/debootstrap.log"; }
    # debootstrap ignores an unmount that fails at its exit: a /proc left mounted would be archived
    "$here/unmount-under.sh" "$rootfs"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    say "docker import -> $root_image"
    # docker import takes whatever tar streamed before it failed: no image is left from a failed archive
    if ! tar -C "$rootfs" --one-file-system -c . | docker import - "$root_image" >/dev/null; then
      docker image rm -f "$root_image" >/dev/null 2>&1 || true
      die "archiving $rootfs into $root_image failed (tar's errors above); the image was removed"
    fi
    rm -rf "$rootfs"
  fi
else
  root_image=$root_choice
  say "root: $root_image"
  if [ "$plan" = 1 ] && ! have_image "$root_image"; then
    planned root "$root_image"
    die "--plan: the root image $root_image is not here, and the deps tag hashes its id: run 'make image'"
  fi
  have_image "$root_image" || docker pull -q "$root_image" >/dev/null || die "cannot pull $root_image"
  pyver=$(docker run --rm --entrypoint python3 "$root_image" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
fi
root_full_id=$(docker image inspect -f '{{.Id}}' "$root_image")
root_id=$(printf '%s' "$root_full_id" | cut -c8-19)
if [ "$root_choice" = offline ]; then
  root_kind=offline root_digest=
else
  root_kind=official
  root_digest=$(docker image inspect -f '{{range .RepoDigests}}{{println .}}{{end}}' "$root_image" | head -1)
fi

# --- 2. the dependency image -------------------------------------------------------------------
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/wheels" "$ctx/debs"
variant_lock >"$ctx/requirements.lock"
cp "$here/finish-deps.sh" "$ctx/"
deps_image="tfpipe/tf29-deps:$(cat "$ctx/requirements.lock" "$here/deps.Dockerfile" "$here/finish-deps.sh" \
  "$here/debs.lock" | { cat; printf '%s %s %s %s' "$root_id" "$pyver" "$root_kind" "$root_digest"; } | sha)"
# The trainer's tag: its Dockerfile, the deps image and every module's path and content (a renamed
# module changes what `import` finds, so names count as well as bytes).
code_id=$( { cat "$here/Dockerfile"; printf '%s\n' "$deps_image";
             cd "$repo" && find trainer -type f -name '*.py' | LC_ALL=C sort | xargs sha256sum; } | sha)
image="tfpipe/trainer:$code_id"
if [ "$plan" = 1 ]; then
  planned root "$root_image"
  planned deps "$deps_image"
  planned trainer "$image"
  exit 0
fi
if have_image "$deps_image"; then
  say "deps: $deps_image (cached)"
  if [ -n "${prefetch:-}" ]; then wait "$prefetch" || true; fi
else
  wheels="$cache/wheelhouse-py$pyver"
  if [ -n "${prefetch:-}" ]; then
    wait "$prefetch" || die "pip download of docker/requirements.lock failed (is the package index reachable?)"
    prefetch=
  else
    say "deps: downloading the $variant variant's locked wheels for Python $pyver into $wheels"
    fetch_wheels "$pyver" || die "pip download of docker/requirements.lock failed (is the package index reachable?)"
  fi
  for whl in "$wheels"/*.whl; do
    case ${whl##*/} in nvidia_*) [ "$variant" = cpu ] && continue ;; esac
    ln "$whl" "$ctx/wheels/" 2>/dev/null || cp "$whl" "$ctx/wheels/"
  done
  if [ "$root_kind" = official ]; then
    # The official Ubuntu root has neither jemalloc nor (maybe) tzdata and no network at build
    # time: bring Debian bullseye's (glibc 2.31, as Ubuntu 20.04), pinned by hash.
    mirror=$(debian_mirror)
    while read -r path hash; do
      case $path in ''|'#'*) continue ;; esac
      deb="$cache/debs/$(basename "$path")"
      mkdir -p "$cache/debs"
      if [ ! -e "$deb" ]; then
        curl -fsSL -o "$deb.tmp" "$mirror/$path" && mv -f "$deb.tmp" "$deb" || rm -f "$deb.tmp"
      fi
      [ "$(sha256sum <"$deb" 2>/dev/null | cut -d' ' -f1)" = "$hash" ] \
        || die "$mirror/$path: missing or its sha256 is not the pinned one (docker/debs.lock)"
      cp "$deb" "$ctx/debs/"
    done <"$here/debs.lock"
  fi
  say "deps: docker build $deps_image (about $([ "$variant" = gpu ] && echo 3 || echo 1) min)"
  DOCKER_BUILDKIT=0 docker build -q --build-arg "ROOT_IMAGE=$root_image" \
    --build-arg "ROOT_KIND=$root_kind" --build-arg "ROOT_REF=$root_image" \
    --build-arg "ROOT_ID=$root_full_id" --build-arg "ROOT_DIGEST=$root_digest" \
    --build-arg "VARIANT=$variant" \
    -f "$here/deps.Dockerfile" -t "$deps_image" "$ctx" 2> >(grep -v -e DEPRECATED -e BuildKit -e '^ *environment-variable' -e '^$' >&2) >/dev/null \
    || die "building $deps_image failed"
  # The legacy builder keeps the throw-away install stage as a dangling image: drop it.
  docker image prune -f --filter label=io.tfpipe.stage=install >/dev/null || true
fi
rm -rf "$ctx"

# --- 3. the trainer image (tag: code_id above) -------------------------------------------------
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
