"""The live view of ``kvforensics watch``: a pure function from the latest inspection and what the
earlier looks saw to what the terminal shows.

What it answers, top down: is the engine busy (its running and waiting requests and how full its
KV cache is, from its own /metrics, with their trend), and how much memory each GPU has left, with
a sparkline of free memory per GPU. The sparklines share one scale, printed in the column's
header: a row that draws lower has less free memory, whichever GPU it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Optional, Sequence, Tuple

from kvforensics.agent.model.live import Inspection
from kvforensics.agent.plugin import ENGINES, display

GIB = 1 << 30
BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_CELLS = 30  # the widest sparkline: 80 columns hold it beside the figures
LOAD_CELLS = 12  # the KV usage trend beside the load figures, within 80 columns


@dataclass
class Looks:
    """What the earlier refreshes saw: free bytes per GPU index, and the engine's load figures."""

    free: Dict[int, Deque[Optional[int]]] = field(default_factory=dict)
    load: Dict[str, Deque[Optional[float]]] = field(default_factory=dict)  # running, queued, kv_usage


def spark(values: Sequence[Optional[float]], width: int, lo: float, hi: float) -> str:
    """``values`` in at most ``width`` cells on the scale ``lo``–``hi`` (the same for every row that
    shares it); each cell is the lowest value of its bucket (a dip is never averaged away); a look
    with no figure is blank."""
    n = len(values)
    cells = min(width, n)
    out = []
    for i in range(cells):
        chunk = [v for v in values[i * n // cells:(i + 1) * n // cells] if v is not None]
        if not chunk:
            out.append(" ")
        elif hi <= lo:
            out.append(BLOCKS[len(BLOCKS) // 2])
        else:
            share = (min(chunk) - lo) / (hi - lo)
            out.append(BLOCKS[max(0, min(len(BLOCKS) - 1, int(share * (len(BLOCKS) - 1) + 0.5)))])
    return "".join(out)


def free_scale(looks: Looks) -> Optional[Tuple[int, int]]:
    """The lowest and highest free memory any GPU showed in the looks kept: every GPU's scale."""
    known = [v for series in looks.free.values() for v in series if v is not None]
    return (min(known), max(known)) if known else None


def _count(value: Optional[float]) -> str:
    return "—" if value is None else "{:,.0f}".format(value)


def load_of(insp: Inspection) -> Dict[str, Optional[float]]:
    """The engine's running and waiting requests and KV-cache usage (0–1) from its /metrics ({} when
    the engine is unknown)."""
    model = ENGINES.find(insp.engine_kind)
    return dict(model.load.read(insp.snapshot.http.metrics)) if model is not None else {}


def load_line(insp: Inspection, looks: Looks, http: bool) -> str:
    """The engine's load in a line: what it serves, what waits, how full its KV cache is (with the
    trend), or why there are no such figures."""
    if insp.engine is None:
        return "No inference server found on this node: GPU memory only."
    name = "{} ({})".format(display(insp.engine_kind), insp.engine)
    load = load_of(insp)
    if not http:
        return "{}: requests and KV usage not asked (--no-http).".format(name)
    if all(load.get(k) is None for k in ("running", "queued", "kv_usage")):
        why = "; ".join(p.message for p in insp.problems if p.code.startswith("engine_http.")) or \
            "its /metrics holds no load figures"
        return "{}: no requests or KV usage: {}.".format(name, why)
    usage = load.get("kv_usage")
    parts = ["{} running".format(_count(load.get("running"))), "{} waiting".format(_count(load.get("queued"))),
             "KV cache {} in use".format("—" if usage is None else "{:.0%}".format(usage))]
    trend = spark(list(looks.load.get("kv_usage", ())), LOAD_CELLS, 0.0, 1.0)
    return "{}: {}{}".format(name, " · ".join(parts), "  " + trend if trend.strip() else "")


def remember(looks: Looks, insp: Inspection, keep: int = 60) -> None:
    """Add this look's figures to ``looks`` (at most ``keep`` per series)."""
    import collections

    for g in insp.gpus:
        looks.free.setdefault(g.index, collections.deque(maxlen=keep)).append(g.free_bytes)
    load = load_of(insp)
    for key in ("running", "queued", "kv_usage"):
        looks.load.setdefault(key, collections.deque(maxlen=keep)).append(load.get(key))


def view(insp: Inspection, looks: Looks, interval: float, http: bool = True) -> Any:
    """The title, the engine's load, and a row per GPU: used, free, and free over the looks kept."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    title = Text("kvforensics watch · {} · every {:g} s · Ctrl-C to leave".format(insp.target, interval),
                 style="bold")
    load = Text(load_line(insp, looks, http))
    if not insp.gpus:  # say what is missing in a sentence, not inside the table's sparkline column
        why = "; ".join(p.message for p in insp.problems[:2]) or "NVML reports no GPUs"
        return Group(title, load, Text("No GPUs to watch: {}.".format(why)))
    scale = free_scale(looks)
    lo, hi = scale if scale is not None else (0, 0)
    looked = max((len(s) for s in looks.free.values()), default=0)
    table = Table(box=None, pad_edge=False, show_edge=False)
    for col, just in (("GPU", "right"), ("rank", "left"), ("used GiB", "right"), ("free GiB", "right"),
                      ("free, last {} looks ({:.2f}–{:.2f} GiB)".format(looked, lo / GIB, hi / GIB), "left")):
        table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for g in insp.gpus:
        table.add_row(str(g.index), g.rank or "—", _gib(g.used_bytes), _gib(g.free_bytes),
                      spark(list(looks.free.get(g.index, ())), SPARK_CELLS, lo, hi))
    return Group(title, load, table, Text(_legend(scale), style="dim"))


def _gib(n: Optional[int]) -> str:
    return "—" if n is None else "{:.2f}".format(n / GIB)


def _legend(scale: Optional[Tuple[int, int]]) -> str:
    if scale is None or scale[0] == scale[1]:
        return "Free memory per look, every GPU on one scale (level: nothing moved yet)."
    return "Free memory per look, every GPU on one scale: ▁ {:.2f} to █ {:.2f} GiB.".format(
        scale[0] / GIB, scale[1] / GIB)

