"""Render recorded history: low-water free memory per GPU and rank, peak KV usage, sparklines.

GPUs whose rows are identical share one row ("0–7 ×8"); the table fits any width from 80
columns up, the sparkline taking what the other columns leave (``reports/fit.py``).
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, List, Optional, Sequence, Tuple

from kvforensics.agent.model.node_rules import MEASURED_MIN_SAMPLES, MEASURED_MIN_SPAN_S, is_measured
from kvforensics.reports import fit
from kvforensics.reports.fit import Col

GIB = 1 << 30
BLOCKS = "▁▂▃▄▅▆▇█"
SCHEMA = "kvforensics.history/1"
SPARK_CELLS = (14, 40)  # the narrowest sparkline worth showing, and the widest


def sparkline(values: Sequence[Optional[int]], width: int = 40) -> str:
    """Free memory over time; each cell is the *lowest* value of its bucket (low-water view)."""
    known = [v for v in values if v is not None]
    if not known:
        return ""
    buckets: List[Optional[int]] = []
    n = len(values)
    cells = min(width, n)
    for i in range(cells):
        chunk = [v for v in values[i * n // cells:(i + 1) * n // cells] if v is not None]
        buckets.append(min(chunk) if chunk else None)
    lo, hi = min(known), max(known)
    out = []
    for v in buckets:
        if v is None:
            out.append(" ")
        elif hi == lo:
            out.append(BLOCKS[len(BLOCKS) // 2])
        else:
            out.append(BLOCKS[int((v - lo) / (hi - lo) * (len(BLOCKS) - 1))])
    return "".join(out)


def _when(ts: Optional[float]) -> str:
    if ts is None:
        return "—"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _gib(n: Optional[int]) -> str:
    return "—" if n is None else "{:.2f}".format(n / GIB)


def to_json(path: str, since: str, runs: Sequence[Any]) -> Dict[str, Any]:
    return {"schema": SCHEMA, "db": path, "since": since, "runs": [{
        "run_key": r.run_key, "engine": r.engine, "model": r.model, "first_seen": r.first_seen,
        "last_seen": r.last_seen, "samples": r.samples, "kv_tokens": r.kv_tokens,
        "peak_used_tokens": r.peak_used_tokens, "peak_token_usage": r.peak_token_usage,
        "gpus": [{"gpu": g.gpu, "uuid": g.uuid, "rank": g.rank, "samples": g.samples,
                  "min_free_bytes": g.min_free_bytes, "max_free_bytes": g.max_free_bytes,
                  "last_free_bytes": g.last_free_bytes, "min_free_at": g.min_free_at} for g in r.gpus]}
        for r in runs]}


def render(path: str, since: str, runs: Sequence[Any], plots: Dict[int, List[Optional[int]]], color: bool = True,
           width: int = 110) -> str:
    from kvforensics.reports.terminal import console, say, text_of

    buf, c = console(color, width)
    say(c, "kvforensics history · {} · last {} · {} engine run(s)".format(path, since, len(runs)))
    if not runs:
        say(c, "no samples in this window (kvforensics record adds them)", indent=2)
    for r in runs:
        c.print()
        say(c, "run {} · {} · {} · {} → {} · {:,} samples".format(
            r.run_key, r.engine or "no inference server was running", r.model or "model unknown", _when(r.first_seen),
            _when(r.last_seen), r.samples))
        say(c, _basis(r), indent=2)
        if r.kv_tokens:
            usage = "—" if r.peak_token_usage is None else "{:.0%}".format(r.peak_token_usage)
            if r.peak_used_tokens is not None:
                peak = "peak {:,} tokens in use ({})".format(r.peak_used_tokens, usage)
            elif r.peak_token_usage is not None:  # vLLM reports its cache usage as a share, not tokens
                peak = "peak KV cache usage {}".format(usage)
            else:
                peak = "no /metrics samples"
            say(c, "KV pool {:,} tokens; {}".format(r.kv_tokens, peak), indent=2)
        _low_water_table(c, r, plots)
    return text_of(buf)


def _basis(r: Any) -> str:
    """Whether this run's low-water marks count as measured (the rule the recommendations follow)."""
    if is_measured(r):
        return "a measurement: the low-water marks size recommendations as 'measured'"
    return ("one look: a measurement needs {:.0f} minutes and {} samples, so recommendations from it stay "
            "'estimated'").format(MEASURED_MIN_SPAN_S / 60, MEASURED_MIN_SAMPLES)


COLUMNS = (Col("GPU", "right"), Col("rank", priority=30, give=fit.NOTES), Col("samples", "right"),
           Col("lowest", "right"), Col("when lowest", priority=15), Col("highest", "right", priority=10),
           Col("now", "right"))


def _rows(r: Any, plots: Dict[int, List[Optional[int]]]) -> List[Tuple[List[str], List[Optional[int]]]]:
    """One row per group of GPUs whose figures and plots are identical: (cells, the plot's values)."""
    keys = [("{:,}".format(g.samples), _gib(g.min_free_bytes), _when(g.min_free_at), _gib(g.max_free_bytes),
             _gib(g.last_free_bytes), tuple(plots.get(g.gpu, []))) for g in r.gpus]
    out = []
    for members in fit.collapse_rows(keys, list(range(len(r.gpus)))):
        gpus = [r.gpus[i] for i in members]
        key = keys[members[0]]
        rank = fit.rank_label([g.rank for g in gpus])  # text from the file: the table prints cells as text
        out.append(([fit.group_label([g.gpu for g in gpus]), rank] + list(key[:5]), list(key[5])))
    return out


def _low_water_table(c: Any, r: Any, plots: Dict[int, List[Optional[int]]]) -> None:
    from kvforensics.reports.terminal import print_table

    rows = _rows(r, plots)
    title = "Free GiB per GPU (lowest = the low-water mark; identical GPUs share a row)"
    width = int(c.width)
    # the table without its plot, then the plot in what is left (none when under SPARK_CELLS[0])
    room = width - fit.table_width(fit.fit_table(COLUMNS, [cells for cells, _ in rows], width - SPARK_CELLS[0]
                                                 - fit.SEPARATOR)) - fit.SEPARATOR
    if room < SPARK_CELLS[0]:
        print_table(c, title, COLUMNS, [cells for cells, _ in rows])
        return
    cells = min(SPARK_CELLS[1], room)
    plot = Col("free over time")
    print_table(c, title, COLUMNS + (plot,), [row + [sparkline(values, cells)] for row, values in rows])
