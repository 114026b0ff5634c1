"""Rebuild examples/seed-node.json: the seed node as an evidence bundle.

The seed node (8 x RTX PRO 6000 Blackwell, 97,887 MiB each; Kimi-K2.5 TP8 with EAGLE-3;
about 5 GiB free per GPU; 396 GiB host RAM available) is collected with kvforensics' own
collectors from the fake NVML driver and a fake SGLang process tree writing the seed log
(tests/fakenode.py), then given the seed host's RAM figures and neutral names in place of
this machine's. Run: .venv/bin/python examples/make_seed_bundle.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvforensics.agent.remote.bundles import save  # noqa: E402
from kvforensics.collectors import snapshot  # noqa: E402
from tests.fakenode import FakeNode, build_fake_nvml  # noqa: E402

GIB = 1 << 30
SEED_HOST = {"total_bytes": 503 * GIB, "available_bytes": 396 * GIB, "swap_total_bytes": 0, "swap_free_bytes": 0,
             "cgroup_limit_bytes": None, "cgroup_usage_bytes": None}


def _rewrite(value, old: str, new: str):
    if isinstance(value, dict):
        return {k: _rewrite(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite(v, old, new) for v in value]
    if isinstance(value, str):
        return value.replace(old, new)
    return value


def owned_by(snap: dict, user: str, uid: int) -> None:
    """Every process of the bundle runs as the service user a real node would have, not as this machine's."""
    for proc in snap["gpu_processes"]["processes"].values():
        proc["user"], proc["uid"] = user, uid
    for engine in snap["engines"]["engines"]:
        for proc in [engine["server"]] + engine["schedulers"] + engine["helpers"]:
            if proc:
                proc["user"], proc["uid"] = user, uid


def write_bundle(node, name: str, paths: list, hostname: str, host: dict, user: str, uid: int) -> int:
    """Collect a started fake ``node`` with kvforensics' collectors into examples/``name``, its paths
    (``(this machine's, the bundle's)`` pairs, then the node's work folder and this Python) made neutral."""
    lib = build_fake_nvml()
    with node:
        os.environ["FAKE_NVML_SCENARIO"] = str(node.scenario)
        snap = snapshot.collect(nvml_lib=str(lib), http=False)
    neutral = [(str(node.dir), "/opt/" + user), (sys.executable, "/opt/{}/venv/bin/python3".format(user))]
    for old, new in paths + neutral:
        snap = _rewrite(snap, old, new)
    snap["hostname"] = hostname
    snap["host_memory"].update(host)
    owned_by(snap, user, uid)
    out = ROOT / "examples" / name
    save(snap, str(out))
    print("wrote {} ({} GPUs, {} log lines)".format(out, len(snap["nvml"]["gpus"]), len(snap["engine_log"]["lines"])))
    json.loads(out.read_text())
    return 0


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="kvf-seed-"))
    return write_bundle(FakeNode(work), "seed-node.json", [(str(work / "models"), "/models"), (
        str(work / "server.log"), "/var/log/sglang/kimi-k2.5.log")], "gpu-node-07", SEED_HOST, "sglang", 998)


if __name__ == "__main__":
    sys.exit(main())
