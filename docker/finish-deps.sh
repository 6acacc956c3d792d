#!/bin/sh
# Runs in the throw-away install stage of deps.Dockerfile, after the locked wheels are installed
# into /opt/tfpipe/deps. Everything the final image needs beyond that tree goes into the overlay
# /opt/tfpipe/overlay, which deps.Dockerfile copies onto / in one step:
#   - the CUDA 11 runtime from NVIDIA's wheels, registered with ld.so (etc/ld.so.conf.d), so TF's
#     dlopen of a bare soname (libcudnn.so.8, ...) finds it whatever LD_LIBRARY_PATH says;
#   - jemalloc and the time zone database, when the root lacks them (the official Ubuntu root):
#     taken from the pinned Debian bullseye packages in /tmp/debs (same glibc 2.31 as Ubuntu 20.04).
set -eu
deps=/opt/tfpipe/deps
overlay=/opt/tfpipe/overlay
mkdir -p "$overlay"

if [ -d "$deps/nvidia" ]; then
  if ldconfig -p | grep -q 'libcudnn\.so\.8 '; then
    # The official root ships CUDA 11.2 + cuDNN 8.1, the combination TF 2.9 was tested with:
    # use it, and do not carry a second CUDA beside it.
    echo "finish-deps: the root image has its own CUDA/cuDNN; dropping the CUDA wheels"
    rm -rf "$deps/nvidia" "$deps"/nvidia_*
  else
    # Libraries TF never opens (multi-GPU cuSOLVER, the FFTW and BLAS drop-in shims, OpenCL).
    rm -f "$deps"/nvidia/cusolver/lib/libcusolverMg.so.* "$deps"/nvidia/cufft/lib/libcufftw.so.* \
          "$deps"/nvidia/cublas/lib/libnvblas.so.* "$deps"/nvidia/cuda_runtime/lib/libOpenCL.so.*
    mkdir -p "$overlay/etc/ld.so.conf.d"
    for lib in "$deps"/nvidia/*/lib; do echo "$lib"; done >"$overlay/etc/ld.so.conf.d/tfpipe-cuda.conf"
  fi
fi

jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
if [ ! -e "$jemalloc" ] || [ ! -e /usr/share/zoneinfo/UTC ]; then
  for deb in /tmp/debs/*.deb; do
    [ -e "$deb" ] || { echo "finish-deps: the root lacks jemalloc or tzdata and no .deb was given" >&2; exit 1; }
    dpkg-deb -x "$deb" /tmp/debroot
  done
  if [ ! -e "$jemalloc" ]; then
    mkdir -p "$overlay$(dirname "$jemalloc")"
    cp -L /tmp/debroot$jemalloc "$overlay$jemalloc"
  fi
  if [ ! -e /usr/share/zoneinfo/UTC ]; then
    mkdir -p "$overlay/usr/share"
    cp -a /tmp/debroot/usr/share/zoneinfo "$overlay/usr/share/"
  fi
fi
