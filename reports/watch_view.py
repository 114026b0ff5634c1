"""The live view of ``kvforensics watch``: a pure function from the latest inspection to a table."""

from __future__ import annotations

from typing import Deque, Dict, Optional

from agent.live import Inspection
from reports.history_report import sparkline

GIB = 1 << 30


def _count(value: Optional[float]) -> str:
    return "—" if value is None else "{:.0f}".format(value)


def view(insp: Inspection, history: Dict[int, Deque[Optional[int]]], interval: float):
    from rich.table import Table

    metrics = insp.snapshot.http.metrics
    usage = next((metrics[k] for k in ("sglang:token_usage", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
                  if k in metrics), None)
    running = metrics.get("sglang:num_running_reqs", metrics.get("vllm:num_requests_running"))
    queued = metrics.get("sglang:num_queue_reqs", metrics.get("vllm:num_requests_waiting"))
    caption = "refresh every {:g} s · Ctrl-C to leave".format(interval)
    if usage is not None:
        caption = "KV usage {:.0%} · running {} · queued {} · ".format(
            usage, _count(running), _count(queued)) + caption
    if not insp.gpus:  # say what is missing in a sentence, not inside the table's sparkline column
        why = "; ".join(p.message for p in insp.problems[:2]) or "NVML reports no GPUs"
        return "kvforensics watch · {}\n  No GPUs to watch: {}.\n  {}".format(insp.target, why, caption)
    table = Table(title="kvforensics watch · {}".format(insp.target), caption=caption, title_justify="left")
    for col, just in (("GPU", "right"), ("rank", "left"), ("used GiB", "right"), ("free GiB", "right"),
                      ("free, last {} looks".format(max(len(h) for h in history.values()) if history else 0), "left")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for g in insp.gpus:
        table.add_row(str(g.index), g.rank or "—", "—" if g.used_bytes is None else "{:.2f}".format(g.used_bytes / GIB),
                      "—" if g.free_bytes is None else "{:.2f}".format(g.free_bytes / GIB),
                      sparkline(list(history.get(g.index, [])), width=30))
    return table
