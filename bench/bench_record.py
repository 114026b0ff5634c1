"""Footprint of one `kvforensics record` on the 8-GPU fake node: peak RSS and CPU time.

Peer, side by side: `nvidia-smi`-style polling tools are not available without a GPU, so the
reference is the bare interpreter (`python3 -c pass`) that any Python cron job pays.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import append  # noqa: E402
from tests.fakenode import FakeNode, build_fake_nvml  # noqa: E402

RUNS = int(os.environ.get("KVF_BENCH_RUNS", "5"))


def _measure(cmd, env):
    proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read()
    return usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def main() -> int:
    lib = build_fake_nvml()
    work = Path(tempfile.mkdtemp(prefix="kvf-bench-record-"))
    with FakeNode(work / "node") as node:
        env = dict(node.env(), PYTHONPATH=str(ROOT))
        cmd = [sys.executable, "-m", "kvforensics", "record", "--db", str(work / "h.db"), "--prom-file",
               str(work / "k.prom"),
               "--nvml-lib", str(lib), "--no-http", "--quiet"]
        results = [_measure(cmd, env) for _ in range(RUNS)]
    base = [_measure([sys.executable, "-c", "pass"], dict(os.environ)) for _ in range(RUNS)]
    rss, cpu = max(r[0] for r in results), min(r[1] for r in results)
    brss, bcpu = max(r[0] for r in base), min(r[1] for r in base)
    append("record footprint", [
        "| one run on the 8-GPU fake node | peak RSS | CPU time (user + sys) |", "|---|---|---|",
        "| `kvforensics record --prom-file …` (1 sample, SQLite + textfile) | {:.0f} MB | {:.3f} s "
        "|".format(rss / 1e6, cpu),
        "| `python3 -c pass` | {:.0f} MB | {:.3f} s |".format(brss / 1e6, bcpu),
        "", "Ratio of CPU time: {:.1f}. Max RSS over {} runs, min CPU over {} runs.".format(cpu / bcpu, RUNS, RUNS)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
