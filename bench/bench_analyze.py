"""Benchmark `kvforensics analyze` on 2 GiB logs against `grep -c` on the same file.

Cases (each file is 2 GiB of runtime "Decode batch" lines plus one startup):
  end:   the startup is near the end (the common case: the last restart)
  begin: the startup is at the very beginning (the worst case for a backward search)
Reported: best-of-N wall time, peak RSS of the analyze process (os.wait4), and the ratio to
`grep -c 'KV Cache is allocated'`. Results are appended to bench/RESULTS.md with the machine
and date. Files go to $KVF_BENCH_DIR (default: a temp dir), removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import append, best, run, write_log  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log"
SIZE = int(os.environ.get("KVF_BENCH_BYTES", 2 << 30))
RUNS = int(os.environ.get("KVF_BENCH_RUNS", "3"))
KVF = [sys.executable, "-m", "kvforensics"]


def _noise_block() -> bytes:
    line = ("[2026-01-20 10:00:00 TP0] Decode batch. #running-req: 12, #token: 45678, token usage: 0.29, "
            "accept len: 2.71, cuda graph: True, gen throughput (token/s): 1234.56, #queue-req: 0\n")
    return (line * 40000).encode()


def _write(path: Path, startup_first: bool) -> None:
    write_log(path, SEED.read_bytes(), _noise_block(), SIZE, startup_first)


def main() -> int:
    base = Path(os.environ.get("KVF_BENCH_DIR") or tempfile.mkdtemp(prefix="kvf-bench-"))
    rows = []
    try:
        for name, first in (("startup near the end", False), ("startup at the beginning", True)):
            path = base / "bench-{}.log".format("begin" if first else "end")
            _write(path, first)
            run(["wc", "-c", str(path)])
            run(["grep", "-c", "x", str(path)])  # warm the page cache for both tools alike
            kvf_t, kvf_rss, rc = best(KVF + ["analyze", str(path), "--json", "--fail-on", "never"], RUNS)
            assert rc == 0, "analyze failed on {}".format(path)
            grep_t, _, _ = best(["grep", "-c", "KV Cache is allocated", str(path)], RUNS)
            rows.append((name, path.stat().st_size, kvf_t, grep_t, kvf_rss))
            path.unlink()
        help_t, _, _ = best(KVF + ["--help"], RUNS)
        py_t, _, _ = best([sys.executable, "-c", "pass"], RUNS)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    lines = ["| case | log size | kvforensics analyze | grep -c | ratio | peak RSS |", "|---|---|---|---|---|---|"]
    for name, size, kt, gt, rss in rows:
        lines.append("| {} | {:.2f} GiB | {:.3f} s | {:.3f} s | {:.2f} | {:.0f} MB |".format(
            name, size / (1 << 30), kt, gt, kt / gt, rss / 1e6))
    lines += ["", "`kvforensics --help`: {:.3f} s (bare `python -c pass`: {:.3f} s). Best of {} runs each, "
              "page cache warm.".format(help_t, py_t, RUNS)]
    append("analyze", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
