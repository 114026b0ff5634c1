"""Benchmark hostile inputs: time and peak RSS of the files that once grew memory with their size.

* a vLLM log of nothing but startup lines: V0's profiling, blocks, concurrency and graph lines
  (examples/vllm-v0-complete.log) repeated with no launch line between them, 25 and 100 MB;
* one physical line of glued SGLang records (the seed startup with its newlines removed), 64 and
  256 MiB, from a file and from stdin;
* a 50 MiB bundle of empty GPU entries (``inspect --from``).

``KVF_BENCH_BEFORE=DIR`` also runs another checkout (e.g. ``git worktree add DIR main``) for a
before/after table. Results are appended to bench/RESULTS.md; files go to $KVF_BENCH_DIR.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import append  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RUNS = int(os.environ.get("KVF_BENCH_RUNS", "3"))


# The inputs are written by a child: this process stays small, since a child's peak RSS (ru_maxrss)
# counts what it was forked from (the fork's pages, before exec).
_WRITE = r"""
import json, sys
from pathlib import Path
root, folder, MIB = Path(sys.argv[1]), Path(sys.argv[2]), 1 << 20
def repeat(unit, size, name):
    with open(folder / name, "wb") as f:
        for _ in range(size // len(unit)):
            f.write(unit)
v0 = (root / "examples" / "vllm-v0-complete.log").read_bytes()
v0 = v0 if v0.endswith(b"\n") else v0 + b"\n"
repeat(v0, 25 * 10**6, "v0-25.log")
repeat(v0, 100 * 10**6, "v0-100.log")
glued = (root / "examples" / "kimi-k2.5-tp8-eagle3.log").read_bytes().replace(b"\n", b"")
repeat(glued, 64 * MIB, "g64.log")
repeat(glued, 256 * MIB, "g256.log")
seed = json.loads((root / "examples" / "seed-node.json").read_text(encoding="utf-8"))
(folder / "gpus-50MiB.json").write_text(json.dumps(seed).replace('"gpus": [', '"gpus": [' + "{}," * (50 * MIB // 3), 1))
"""

CASES = [
    ("vLLM V0 startup lines only, 25 MB", ["analyze", "v0-25.log"], None),
    ("vLLM V0 startup lines only, 100 MB", ["analyze", "v0-100.log"], None),
    ("SGLang glued records, one line, 64 MiB", ["analyze", "g64.log"], None),
    ("SGLang glued records, one line, 256 MiB", ["analyze", "g256.log"], None),
    ("SGLang glued records, one line, 64 MiB, stdin", ["analyze", "-"], "g64.log"),
    ("bundle of empty GPU entries, 50 MiB", ["inspect", "--from", "gpus-50MiB.json"], None),
]


def _run(tree: Path, argv: Sequence[str], stdin: Optional[Path]) -> Tuple[float, int, int]:
    """(wall s, peak RSS bytes, exit code) of one run of the kvforensics in ``tree`` (run from there, so
    ``-m kvforensics`` is that tree's)."""
    with open(stdin or os.devnull, "rb") as f:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "kvforensics", *argv, "--format", "oneline"], cwd=str(tree),
                                stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - start, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def _measure(tree: Path, folder: Path, argv: Sequence[str], stdin: Optional[str]) -> str:
    argv = [str(folder / a) if (folder / a).exists() else a for a in argv]
    results = [_run(tree, argv, folder / stdin if stdin else None) for _ in range(RUNS)]
    return "{:.2f} s, {:,} MB (exit {})".format(min(r[0] for r in results), max(r[1] for r in results) // 10**6,
                                                 results[-1][2])


def main() -> None:
    folder = Path(os.environ.get("KVF_BENCH_DIR") or tempfile.mkdtemp(prefix="kvf-hostile-"))
    folder.mkdir(parents=True, exist_ok=True)
    before = os.environ.get("KVF_BENCH_BEFORE")
    try:
        subprocess.run([sys.executable, "-c", _WRITE, str(ROOT), str(folder)], check=True)
        rows = []
        for label, argv, stdin in CASES:
            then = _measure(Path(before), folder, argv, stdin) if before else "—"
            rows.append("| {} | {} | {} |".format(label, then, _measure(ROOT, folder, argv, stdin)))
            print(rows[-1], flush=True)
        append("hostile inputs", ["| input | before | now |", "|---|---|---|"] + rows + [
            "", "Best of {} runs (time), the most of them (peak RSS); `--format oneline`.{}".format(
                RUNS, " Before: {}.".format(before) if before else "")])
    finally:
        if not os.environ.get("KVF_BENCH_DIR"):
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
