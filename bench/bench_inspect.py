"""Benchmark `kvforensics inspect` on the 8-GPU fake SGLang node and a 2-GPU fake vLLM node, and
`kvforensics --help`.

The peer, run side by side: `ps -e -o pid,args` (one scan of the process table, which inspect
also does) and a bare `python3 -c pass`. Appends to bench/RESULTS.md with machine and date.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import append, best  # noqa: E402
from tests.fakenode import FakeNode, FakeVllmNode, build_fake_nvml  # noqa: E402

RUNS = int(os.environ.get("KVF_BENCH_RUNS", "5"))


def main() -> int:
    lib = build_fake_nvml()
    kvf = [sys.executable, "-m", "kvforensics"]
    with FakeNode(Path(tempfile.mkdtemp(prefix="kvf-bench-node-"))) as node:
        os.environ["FAKE_NVML_SCENARIO"] = str(node.scenario)
        inspect_t, rss, rc = best(kvf + ["inspect", "--json", "--nvml-lib", str(lib), "--no-http", "--fail-on",
                                         "never"], RUNS)
        assert rc == 0, "inspect failed"
        ps_t, _, _ = best(["ps", "-e", "-o", "pid,args"], RUNS)
    with FakeVllmNode(Path(tempfile.mkdtemp(prefix="kvf-bench-vllm-")), tp=2) as node:
        os.environ["FAKE_NVML_SCENARIO"] = str(node.scenario)
        vllm_t, vllm_rss, rc = best(kvf + ["inspect", "--json", "--nvml-lib", str(lib), "--no-http", "--fail-on",
                                           "never"], RUNS)
        assert rc == 0, "inspect (vLLM) failed"
    help_t, _, _ = best(kvf + ["--help"], RUNS)
    py_t, _, _ = best([sys.executable, "-c", "pass"], RUNS)
    append("inspect", [
        "| command | time | peer | peer time | ratio |", "|---|---|---|---|---|",
        "| `kvforensics inspect --json` (8-GPU fake node, real processes, seed log) | {:.3f} s | `ps -e -o pid,args` | "
        "{:.3f} s | {:.1f} |".format(inspect_t, ps_t, inspect_t / ps_t),
        "| `kvforensics inspect --json` (2-GPU fake vLLM node: server, engine core, 2 workers, 0.27 log) | {:.3f} s "
        "| `ps -e -o pid,args` | {:.3f} s | {:.1f} |".format(vllm_t, ps_t, vllm_t / ps_t),
        "| `kvforensics --help` | {:.3f} s | `python3 -c pass` | {:.3f} s | {:.1f} |".format(help_t, py_t,
                                                                                             help_t / py_t),
        "", "Peak RSS of inspect: {:.0f} MB (vLLM node: {:.0f} MB). Best of {} runs.".format(rss / 1e6, vllm_rss / 1e6,
                                                                                             RUNS)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
