"""The live view of ``kvforensics watch``: a pure function from the latest inspection to a table."""

from __future__ import annotations

from typing import Deque, Dict, Optional

from agent.model.live import Inspection
from agent.plugin import ENGINES
from reports.history_report import sparkline

GIB = 1 << 30


def _count(value: Optional[float]) -> str:
    return "—" if value is None else "{:.0f}".format(value)


def view(insp: Inspection, history: Dict[int, Deque[Optional[int]]], interval: float):
    from rich.table import Table

    metrics = insp.snapshot.http.metrics
    model = ENGINES.find(insp.engine_kind)
    load = model.load.read(metrics) if model is not None else {}
    usage, running, queued = load.get("kv_usage"), load.get("running"), load.get("queued")
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
