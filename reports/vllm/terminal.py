"""A vLLM startup in the terminal: a header and a per-worker ledger (GiB; — where the log has no figure)."""

from __future__ import annotations

from typing import Any, List

from kvforensics.reports.fit import NOTES, Col
from kvforensics.reports.terminal import gib_cell, print_table, say

# (header, field, shorter header where 80 columns need it: spelt out under the table)
COLUMNS = (("total", "total_gpu_bytes", ""), ("budget T·u", "requested_bytes", "T·u"),
           ("weights", "weights_bytes", ""), ("non-torch", "non_torch_bytes", ""),
           ("activation", "activation_peak_bytes", "act."), ("graphs", "cuda_graph_bytes", ""),
           ("KV", "available_kv_bytes", ""))


def brief(a: Any) -> List[str]:
    """The startup in a sentence for the one-screen report: release, model, workers, the budget flag,
    the KV cache and vLLM's own concurrency figure."""
    facts = ["vLLM {}".format(a.era.hint or "?")]
    model = a.server_args.get("model") or a.server_args.get("model_path")
    if model:
        facts.append(str(model).rstrip("/").rsplit("/", 1)[-1])
    facts.append("{} worker(s)".format(a.worker_count()))
    utilization = next((w.gpu_memory_utilization for w in a.ranks if w.gpu_memory_utilization is not None), None)
    if utilization is not None:
        facts.append("--gpu-memory-utilization {:g}".format(utilization))
    if a.kv_cache_tokens is not None:
        facts.append("GPU KV cache {:,} tokens".format(a.kv_cache_tokens))
    if a.max_concurrency:
        facts.append("max concurrency {:.2f}x at {:,} tokens".format(a.max_concurrency["times"],
                                                                     a.max_concurrency["tokens_per_request"]))
    return [" · ".join(facts)]


def render(c: Any, a: Any) -> None:
    """A vLLM analysis (agent/vllm/): header and a per-worker ledger (GiB; — where the log has no figure)."""
    say(c, "vLLM {} (from line formats{})".format(a.era.hint or "?", ", era " + a.era.name if a.era.name else ""))
    facts = ["{} worker(s)".format(a.worker_count())]
    if a.kv_cache_tokens is not None:
        facts.append("GPU KV cache {:,} tokens".format(a.kv_cache_tokens))
    if a.gpu_blocks is not None:
        facts.append("{:,} GPU blocks".format(a.gpu_blocks))
    if a.max_concurrency:
        facts.append("max concurrency {:.2f}x at {:,} tokens".format(a.max_concurrency["times"],
                                                                     a.max_concurrency["tokens_per_request"]))
    say(c, " · ".join(facts), indent=2)
    for p in a.problems:
        say(c, "! {}: {}".format(p.code, p.message), indent=2, style="yellow")
    if a.ranks:
        columns = [Col("worker", priority=40, give=NOTES), Col("u", "right")] + [
            Col(label, "right", short=short) for label, _, short in COLUMNS]
        rows = [[w.rank or "(no prefix)", "—" if w.gpu_memory_utilization is None else
                 "{:g}".format(w.gpu_memory_utilization)] + [gib_cell(getattr(w, key)) for _, key, _ in COLUMNS]
                for w in a.ranks]
        print_table(c, "Memory per worker (GiB)", columns, rows)
