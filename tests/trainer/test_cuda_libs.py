"""The image's CUDA 11 runtime is complete: every library TF 2.9 opens loads, dependencies and all.

Without a GPU, TF stops at the driver (``libcuda.so.1``, which the NVIDIA Container Toolkit mounts
from the host) before it opens the math libraries, so each soname TF's loader asks for is opened
here with ctypes (``dlopen`` with ``RTLD_NOW``: every dependency and every symbol must resolve),
one fresh process per library so none rides on another's already-loaded dependencies. TF's own
start-up log must then name nothing but the driver as missing. What a GPU host adds (the driver,
kernels actually running) is checked by ``scripts/gpu-check.sh``.

On the CPU variant (``TFPIPE_IMAGE_VARIANT=cpu``) the same tests assert the opposite: no CUDA.
"""

import json
import os
import re
import subprocess
import sys

import pytest

# What TF 2.9's stream_executor/platform/default/dso_loader.cc opens for its CUDA 11.2 build
# (TF_CUDART_VERSION 11.0, cuBLAS 11, cuFFT 10, cuRAND 10, cuSOLVER 11, cuSPARSE 11, cuDNN 8).
# TensorRT's libnvinfer.so.7 is optional (TF-TRT only) and no package index wheel carries it.
TF_SONAMES = ["libcudart.so.11.0", "libcublas.so.11", "libcublasLt.so.11", "libcufft.so.10",
              "libcurand.so.10", "libcusolver.so.11", "libcusparse.so.11", "libcudnn.so.8"]
# libcudnn.so.8 is a small dispatcher that opens these when a kernel family is first used.
CUDNN_PARTS = ["libcudnn_ops_infer.so.8", "libcudnn_ops_train.so.8", "libcudnn_cnn_infer.so.8",
               "libcudnn_cnn_train.so.8", "libcudnn_adv_infer.so.8", "libcudnn_adv_train.so.8"]
# NCCL, for multi-GPU all-reduce (tf.distribute.MirroredStrategy's NcclAllReduce).
OTHER = ["libnccl.so.2"]
DRIVER = "libcuda.so.1"

ROOT_INFO = json.load(open("/opt/tfpipe/root-image.json"))
GPU_VARIANT = ROOT_INFO.get("variant", "gpu") == "gpu"

_LOAD = r"""
import ctypes, json, sys
name = sys.argv[1]
try:
    ctypes.CDLL(name)  # ctypes always adds RTLD_NOW: unresolved symbols fail here
except OSError as err:
    print(json.dumps({"ok": False, "error": str(err)}))
else:
    maps = open("/proc/self/maps").read().split()
    path = next((p for p in maps if p.endswith("/" + name) or "/" + name + "." in p), None)
    print(json.dumps({"ok": True, "path": path}))
"""


def load_alone(soname):
    """dlopen ``soname`` by bare name in a fresh interpreter; return ``{"ok", "path"|"error"}``."""
    proc = subprocess.run([sys.executable, "-c", _LOAD, soname], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def tf_startup_log():
    """TF's full C++ log of an import plus a GPU device query, as on any stage's start."""
    # dso_loader logs each successful dlopen at VLOG(1): turn that on for that one file.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="dso_loader=1")
    probe = ("import tensorflow as tf; print('GPUS', tf.config.list_physical_devices('GPU')); "
             "print('MAPPED', sorted(set(l.split()[-1] for l in open('/proc/self/maps') if 'libcudart' in l)))")
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout
    return proc.stdout


def driver_present():
    return load_alone(DRIVER)["ok"]


@pytest.mark.parametrize("soname", TF_SONAMES + CUDNN_PARTS + OTHER)
def test_library_loads_with_all_dependencies(soname):
    result = load_alone(soname)
    if GPU_VARIANT:
        assert result["ok"], "%s does not load: %s" % (soname, result.get("error"))
        # Found through ld.so's search path (the image's ld.so.conf.d entry or the root's CUDA).
        assert result["path"], "%s loaded but is not in /proc/self/maps" % soname
    else:
        assert not result["ok"], "the cpu variant should carry no CUDA, but %s loads from %s" % (
            soname, result.get("path"))


def test_tensorflow_build_matches_the_sonames():
    # The sonames above follow from the CUDA/cuDNN versions TF was built with.
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    assert info["is_cuda_build"] is True
    assert info["cuda_version"] == "11.2" and info["cudnn_version"] == "8", info


def test_library_versions_fit_tf_2_9():
    if not GPU_VARIANT:
        assert not load_alone("libcudnn.so.8")["ok"]
        return
    import ctypes

    # Version queries that need no driver (cudaRuntimeGetVersion does: it answers 35,
    # "insufficient driver", without one).
    cudnn = ctypes.CDLL("libcudnn.so.8")
    cudnn.cudnnGetVersion.restype = ctypes.c_size_t
    version = cudnn.cudnnGetVersion()  # e.g. 8500 for 8.5.0
    assert 8100 <= version < 9000, "TF 2.9 needs cuDNN 8 with minor >= 1, found %d" % version
    cublaslt = ctypes.CDLL("libcublasLt.so.11")
    cublaslt.cublasLtGetVersion.restype = ctypes.c_size_t
    assert 110000 <= cublaslt.cublasLtGetVersion() < 120000


def test_tensorflow_startup_misses_only_the_driver():
    log = tf_startup_log()
    missing = set(re.findall(r"Could not load dynamic library '([^']+)'", log))
    if not GPU_VARIANT:
        assert "libcudart.so.11.0" in missing, log
        return
    assert "Successfully opened dynamic library libcudart.so.11.0" in log, log
    assert re.search(r"MAPPED \[.*/libcudart\.so\.11\.0'\]", log), log
    if driver_present():
        # A GPU host with the NVIDIA Container Toolkit: nothing may be missing.
        assert missing == set(), log
    else:
        assert missing == {DRIVER}, "without a GPU only the driver may be missing:\n" + log
        assert "GPUS []" in log


def test_no_driver_in_the_image():
    # The driver must come from the host (it has to match the kernel module); a copy baked into
    # the image would shadow it. The toolkit mounts it at container start, never at build.
    deps = "/opt/tfpipe/deps"
    found = [os.path.join(d, f) for d, _, files in os.walk(deps) for f in files
             if f.startswith("libcuda.so") or f.startswith("libnvidia-")]
    assert found == []
