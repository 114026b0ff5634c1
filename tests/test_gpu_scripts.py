"""The GPU scripts of bench/ run end to end here too, over the fake NVML driver, so that the one
run a lent GPU gets is not spent on a script that rotted (bench/gpu_live.py's fake mode)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT
from tests.fakenode import build_fake_nvml


def test_gpu_live_script_passes_over_the_fake_driver(tmp_path):
    out = tmp_path / "live.json"
    env = dict(os.environ, KVF_GPU_LIVE_FAKE_LIB=str(build_fake_nvml()), KVF_GPU_LIVE_OUT=str(out))
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_live.py")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(out.read_text())
    assert doc["failures"] == [] and doc["figures"]["unused"] == doc["figures"]["expected_unused"]
    assert doc["report"]["gpus"][0]["rank"] == "EngineCore_DP0"


STUB_CUDA = """
#include <stddef.h>
int cuInit(unsigned f) { return 0; }
int cuDeviceGet(int *d, int o) { *d = o; return 0; }
int cuCtxCreate_v2(void **c, unsigned f, int d) { *c = (void *)1; return 0; }
int cuMemGetInfo_v2(size_t *f, size_t *t) { *f = 100; *t = 200; return 0; }
int cuMemAlloc_v2(unsigned long long *p, size_t n) { *p = 42; return 0; }
int cuMemsetD8_v2(unsigned long long p, unsigned char v, size_t n) { return 0; }
int cuCtxSynchronize(void) { return 0; }
"""


def test_the_cuda_holder_programs_run_their_calls(tmp_path):
    """The GPU scripts' child programs (bench/common.py CUDA_CONTEXT_PROGRAM and what follows it) run
    their whole CUDA driver call sequence against a stub libcuda.so.1: only a lent GPU runs the real one."""
    sys.path.insert(0, str(ROOT))
    import bench.gpu_check as gpu_check
    import bench.gpu_live as gpu_live

    (tmp_path / "cuda.c").write_text(STUB_CUDA)
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"),
                    str(tmp_path / "cuda.c")], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    holder = gpu_check.HOLDER.replace("NBYTES", "4096").replace("DEVICE", "0")
    run = subprocess.run([sys.executable, "-c", holder], input="", capture_output=True, text=True, env=env,
                         timeout=60)
    assert json.loads(run.stdout) == {"free_after_context": 100, "free_after_alloc": 100, "total": 200}, run.stderr
    core = subprocess.Popen([sys.executable, "-c", gpu_live.ENGINE_CORE.replace("NBYTES", "4096")],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert json.loads(core.stdout.readline())["pid"] == core.pid
    finally:
        core.kill()
        core.wait()
