"""A TensorRT-LLM startup in the terminal: a header, its KV passes and a per-rank table (GiB; — where the log has
no figure)."""

from __future__ import annotations

from typing import Any, List

from kvforensics.reports.fit import NOTES, Col
from kvforensics.reports.terminal import gib_cell, print_table, say

# (header, field, shorter header where 80 columns need it)
COLUMNS = (("total", "total_gpu_bytes", ""), ("weights", "weights_bytes", ""), ("peak", "peak_bytes", ""),
           ("available", "available_bytes", "avail."), ("KV budget", "available_kv_bytes", "budget"),
           ("KV cache", "kv_cache_bytes", "KV"))


def _facts(a: Any) -> List[str]:
    facts = ["{} rank(s)".format(a.worker_count())]
    f = a.fraction_given()
    if f is not None:
        facts.append("free_gpu_memory_fraction {:.2f}".format(f[0]))
    if a.kv_cache_tokens is not None:
        facts.append("KV cache {:,} tokens".format(a.kv_cache_tokens))
    if a.summary.max_running_requests:
        facts.append("max_batch_size {:,}".format(a.summary.max_running_requests))
    if a.summary.context_len:
        facts.append("max_seq_len {:,}".format(a.summary.context_len))
    return facts


def brief(a: Any) -> List[str]:
    """The startup in a sentence for the one-screen report."""
    return [" · ".join(["TensorRT-LLM {}".format(a.era.hint or "?")] + _facts(a))]


def render(c: Any, a: Any) -> None:
    say(c, "TensorRT-LLM {} (from line formats)".format(a.era.hint or "?"))
    say(c, " · ".join(_facts(a)), indent=2)
    for p in a.problems:
        say(c, "! {}: {}".format(p.code, p.message), indent=2, style="yellow")
    if len(a.passes) > 1 or any(p.role != "final" for p in a.passes):
        words = ["{} {} ({:,} tokens, line {})".format(p.role, gib_cell(p.kv_cache_bytes), p.kv_tokens or 0,
                                                       p.event.line if p.event.line is not None else "?")
                 for p in a.passes]
        say(c, "KV pools in log order: " + "; ".join(words), indent=2)
    if a.ranks:
        columns = [Col("rank", priority=40, give=NOTES)] + [Col(label, "right", short=short)
                                                           for label, _, short in COLUMNS]
        rows = [[r.rank or "(C++, every rank)"] + [gib_cell(getattr(r, key)) for _, key, _ in COLUMNS]
                for r in a.ranks]
        print_table(c, "Memory per rank (GiB)", columns, rows)
