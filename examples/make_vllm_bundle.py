"""Rebuild examples/vllm-node.json: a vLLM node as an evidence bundle (`kvforensics inspect --from`).

Two H200s (143,771 MiB each, as a real one reports them) serving Llama-3.1-70B at TP=2 with vLLM
0.27 (`--gpu-memory-utilization 0.9`), while a training job holds 2 GiB on GPU 1. Collected with
kvforensics' own collectors from the fake NVML driver and a fake vLLM process tree (API server,
`VLLM::EngineCore`, `VLLM::Worker_TP0/1`) writing its startup log with their live PIDs
(tests/fakenode.py), then given neutral paths and names. Run: .venv/bin/python examples/make_vllm_bundle.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.make_seed_bundle import write_bundle  # noqa: E402
from tests.fakenode import FakeVllmNode  # noqa: E402

GIB = 1 << 30
HOST = {"total_bytes": 2015 * GIB, "available_bytes": 1790 * GIB, "swap_total_bytes": 0, "swap_free_bytes": 0,
        "cgroup_limit_bytes": None, "cgroup_usage_bytes": None}


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="kvf-vllm-"))
    return write_bundle(FakeVllmNode(work, tp=2, foreign={1: 2 * GIB}, port=8000), "vllm-node.json",
                        [(str(work / "server.log"), "/var/log/vllm/llama-70b.log")], "gpu-node-12", HOST, "vllm", 997)


if __name__ == "__main__":
    sys.exit(main())
