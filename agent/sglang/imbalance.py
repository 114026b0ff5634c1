"""Ranks unbalanced in the startup log: SGLang sizes every rank's pool from the least free one.

The offline half of node_rules.rank_imbalance (the live half measures NVML): the ranks' free memory
after loading, and SGLang's own "unbalanced" warning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Tuple

from kvforensics.agent.model.node_rules import IMBALANCE_WARN_BYTES, cell_bytes
from kvforensics.agent.model.records import Finding
from kvforensics.collectors.units import gib

if TYPE_CHECKING:
    from kvforensics.agent.model.context import Context


def _rank_evidence(r, field: str) -> Tuple[str, ...]:  # type: ignore[no-untyped-def]
    s = r.target.sources.get(field)
    if not s:
        return ()
    return ("{} {}".format(r.rank, s) if r.rank else s,)


def log_imbalance(ctx: "Context") -> Iterator[Finding]:
    a = ctx.analysis
    posts = [(r.target.post_load_avail_bytes, r) for r in a.ranks if r.target.post_load_avail_bytes is not None]
    warned = next(iter(a.engine_warnings("unbalanced")), None)
    if len(posts) < 2 and warned is None:
        return
    spread = 0
    detail = ""
    evidence: Tuple[str, ...] = ()
    if len(posts) >= 2:
        lo = min(posts, key=lambda x: x[0])
        hi = max(posts, key=lambda x: x[0])
        spread = hi[0] - lo[0]
        if spread < IMBALANCE_WARN_BYTES and warned is None:
            return
        cell = cell_bytes(ctx)
        cost = " ≈ {:,} tokens".format(spread // cell) if cell else ""
        detail = ("Free memory after loading ranges from {} on {} to {} on {}. SGLang sizes every rank's "
                  "pool from the minimum, so each other rank leaves up to {}{} unused. Something else "
                  "(another process, a leftover allocation) holds memory on {}.").format(
            gib(lo[0]), lo[1].rank, gib(hi[0]), hi[1].rank, gib(spread), cost, lo[1].rank)
        evidence = _rank_evidence(lo[1], "post_load_avail_bytes") + _rank_evidence(hi[1], "post_load_avail_bytes")
    if warned is not None:
        text, at = warned
        detail += " SGLang itself warned: {} ({}).".format(text, at)
        evidence += (at,)
    yield Finding(code="rank_imbalance", severity="warning", title="GPU memory is unbalanced across ranks",
                  detail=detail.strip(), bytes=spread or None, evidence=evidence)
