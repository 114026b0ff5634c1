"""Benchmark `kvforensics analyze` on 2 GiB logs against `grep -c` on the same file.

Cases (each file is 2 GiB of runtime "Decode batch" lines plus one startup):
  end:   the startup is near the end (the common case: the last restart)
  begin: the startup is at the very beginning (the worst case for a backward search)
Reported: best-of-N wall time, peak RSS of the analyze process (os.wait4), and the ratio to
`grep -c 'KV Cache is allocated'`. Results are appended to bench/RESULTS.md with the machine
and date. Files go to $KVF_BENCH_DIR (default: a temp dir), removed afterwards.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log"
SIZE = int(os.environ.get("KVF_BENCH_BYTES", 2 << 30))
RUNS = int(os.environ.get("KVF_BENCH_RUNS", "3"))
KVF = [sys.executable, "-m", "agent"]


def _noise_block() -> bytes:
    line = ("[2026-01-20 10:00:00 TP0] Decode batch. #running-req: 12, #token: 45678, token usage: 0.29, "
            "accept len: 2.71, cuda graph: True, gen throughput (token/s): 1234.56, #queue-req: 0\n")
    return (line * 40000).encode()


def _write(path: Path, startup_first: bool) -> None:
    seed = SEED.read_bytes()
    block = _noise_block()
    with open(path, "wb") as f:
        if startup_first:
            f.write(seed)
        written = 0
        while written < SIZE - len(seed) - 4 * len(block):
            f.write(block)
            written += len(block)
        if not startup_first:
            f.write(seed)
            f.write(block[:1 << 20])  # a little runtime after the startup


def _run(cmd: List[str]) -> Tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit code) of one run.

    stdout goes to a real file: GNU grep stops at the first match when its output is
    /dev/null, which would time a different job.
    """
    out = tempfile.TemporaryFile()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=str(ROOT), stdout=out, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.close()
    return wall, usage.ru_maxrss * 1024, proc.returncode


def _best(cmd: List[str]) -> Tuple[float, int, int]:
    results = [_run(cmd) for _ in range(RUNS)]
    return min(r[0] for r in results), max(r[1] for r in results), results[-1][2]


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return "{} · {} cores · {} · Python {}".format(cpu, os.cpu_count(), platform.platform(), platform.python_version())


def main() -> int:
    base = Path(os.environ.get("KVF_BENCH_DIR") or tempfile.mkdtemp(prefix="kvf-bench-"))
    rows = []
    try:
        for name, first in (("startup near the end", False), ("startup at the beginning", True)):
            path = base / "bench-{}.log".format("begin" if first else "end")
            _write(path, first)
            _run(["wc", "-c", str(path)])
            _run(["grep", "-c", "x", str(path)])  # warm the page cache for both tools alike
            kvf_t, kvf_rss, rc = _best(KVF + ["analyze", str(path), "--json", "--fail-on", "never"])
            assert rc == 0, "analyze failed on {}".format(path)
            grep_t, _, _ = _best(["grep", "-c", "KV Cache is allocated", str(path)])
            rows.append((name, path.stat().st_size, kvf_t, grep_t, kvf_rss))
            path.unlink()
        help_t, _, _ = _best(KVF + ["--help"])
        py_t, _, _ = _best([sys.executable, "-c", "pass"])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["", "## analyze — {}".format(stamp), "", "Machine: {}".format(_machine()), "",
             "| case | log size | kvforensics analyze | grep -c | ratio | peak RSS |",
             "|---|---|---|---|---|---|"]
    for name, size, kt, gt, rss in rows:
        lines.append("| {} | {:.2f} GiB | {:.3f} s | {:.3f} s | {:.2f} | {:.0f} MB |".format(
            name, size / (1 << 30), kt, gt, kt / gt, rss / 1e6))
    lines.append("")
    lines.append("`kvforensics --help`: {:.3f} s (bare `python -c pass`: {:.3f} s). Best of {} runs each, "
                 "page cache warm.".format(help_t, py_t, RUNS))
    text = "\n".join(lines) + "\n"
    print(text)
    with open(ROOT / "bench" / "RESULTS.md", "a", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
