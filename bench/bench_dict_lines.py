"""Benchmark `kvforensics analyze` on a log of dict-bearing serving lines, this tree against a base tree.

The hard-wrapped `non-default args: {…}` tails (real_vllm entries 42, 43) are found by needles; a
needle every dict line holds ("': ") would make each such line a parsed candidate. The log: a V1
startup at the very beginning (the whole file is searched) and then either the stat logger's
throughput lines or the API server's sampling-params line, which carries a Python dict. Set
KVF_BASE to another checkout (e.g. `git archive <commit> | tar -x -C DIR`) to time it alike,
alternating runs. Results are appended to bench/RESULTS.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, append, write_log  # noqa: E402

SIZE = int(os.environ.get("KVF_BENCH_BYTES", 1 << 28))
RUNS = int(os.environ.get("KVF_BENCH_RUNS", "3"))
STARTUP = ROOT / "examples" / "vllm-v1-to-capture.log"
NOISE = {
    "throughput lines": "(APIServer pid=441) INFO 11-24 12:00:00 [loggers.py:127] Engine 000: Avg prompt throughput: "
                        "1234.5 tokens/s, Avg generation throughput: 456.7 tokens/s, Running: 12 reqs, Waiting: 0 "
                        "reqs, GPU KV cache usage: 3.1%, Prefix cache hit rate: 41.2%\n",
    "dict lines": "(APIServer pid=441) INFO 11-24 12:00:00 [serving_chat.py:134] Using default chat sampling params "
                  "from model: {'temperature': 0.7, 'top_p': 0.8}\n",
}


def main() -> int:
    trees = {"this tree": ROOT}
    if os.environ.get("KVF_BASE"):
        trees["base ({})".format(os.environ["KVF_BASE"])] = Path(os.environ["KVF_BASE"])
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # time what an installed user runs: compiled modules
    for tree in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", "kvforensics", "agent", "collectors", "reports"],
                       cwd=str(tree),
                       env=env, check=True)
    base = Path(tempfile.mkdtemp(prefix="kvf-bench-dict-"))
    lines = ["| log | " + " | ".join(trees) + " |", "|---" * (len(trees) + 1) + "|"]
    try:
        for name, noise in NOISE.items():
            path = base / "dict.log"
            write_log(path, STARTUP.read_bytes(), (noise * 40000).encode(), SIZE, True)
            times = {label: [] for label in trees}
            for _ in range(RUNS):  # alternating, so load changes hit both alike
                for label, tree in trees.items():  # run from the tree: `-m kvforensics` imports the cwd's
                    start = time.perf_counter()
                    rc = subprocess.run([sys.executable, "-m", "kvforensics", "analyze", "--json", "--fail-on", "never",
                                         str(path)], cwd=str(tree), env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL).returncode
                    times[label].append(time.perf_counter() - start)
                    assert rc == 0, (label, rc)
            lines.append("| {}, {:.2f} GiB | ".format(name, path.stat().st_size / (1 << 30))
                         + " | ".join("{:.3f} s".format(min(t)) for t in times.values()) + " |")
            path.unlink()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    lines += ["", "Best of {} alternating runs each, page cache warm.".format(RUNS)]
    append("analyze, vLLM, dict-bearing lines", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
