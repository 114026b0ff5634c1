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
