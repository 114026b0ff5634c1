"""Rebuild examples/vllm-node.json: a vLLM node as an evidence bundle (`kvforensics inspect --from`).

Two H200s (143,771 MiB each, as a real one reports them) serving Llama-3.1-70B at TP=2 with vLLM
0.27 (`--gpu-memory-utilization 0.9`), while a training job holds 2 GiB on GPU 1. Collected with
kvforensics' own collectors from the fake NVML driver and a fake vLLM process tree (API server,
`VLLM::EngineCore`, `VLLM::Worker_TP0/1`) writing its startup log with their live PIDs
(tests/fakenode.py), then given neutral paths and names. Run: .venv/bin/python examples/make_vllm_bundle.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.bundles import save  # noqa: E402
from collectors import snapshot  # noqa: E402
from examples.make_seed_bundle import _rewrite  # noqa: E402
from tests.fakenode import FakeVllmNode, build_fake_nvml  # noqa: E402

GIB = 1 << 30
HOST = {"total_bytes": 2015 * GIB, "available_bytes": 1790 * GIB, "swap_total_bytes": 0, "swap_free_bytes": 0,
        "cgroup_limit_bytes": None, "cgroup_usage_bytes": None}


def main() -> int:
    lib = build_fake_nvml()
    work = Path(tempfile.mkdtemp(prefix="kvf-vllm-"))
    with FakeVllmNode(work, tp=2, foreign={1: 2 * GIB}) as node:
        os.environ["FAKE_NVML_SCENARIO"] = str(node.scenario)
        snap = snapshot.collect(nvml_lib=str(lib), http=False)
    snap = _rewrite(snap, str(work / "server.log"), "/var/log/vllm/llama-70b.log")
    snap = _rewrite(snap, str(work), "/opt/vllm")
    snap = _rewrite(snap, sys.executable, "/opt/vllm/venv/bin/python3")
    snap["hostname"] = "gpu-node-12"
    snap["host_memory"].update(HOST)
    for proc in snap["gpu_processes"]["processes"].values():
        proc["user"], proc["uid"] = "vllm", 997
    for engine in snap["engines"]["engines"]:
        for proc in [engine["server"]] + engine["schedulers"] + engine["helpers"]:
            if proc:
                proc["user"], proc["uid"] = "vllm", 997
    out = ROOT / "examples" / "vllm-node.json"
    save(snap, str(out))
    print("wrote {} ({} GPUs, {} log lines)".format(out, len(snap["nvml"]["gpus"]), len(snap["engine_log"]["lines"])))
    json.loads(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
