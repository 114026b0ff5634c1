"""A host-RAM KV tier (HiCache, SGLang 0.5.19+): how large it could be on this node, and its finding.

SGLang keeps 10 GiB of host RAM free for HiCache (research §5); the tier is worth advising only at
MIN_HICACHE_GB per rank or more, adding MIN_GAIN_POOL_SHARE of the GPU pool (node_rules.worth_it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional

from kvforensics.agent.model.node_rules import worth_it
from kvforensics.agent.model.records import Finding
from kvforensics.collectors.units import gib

if TYPE_CHECKING:
    from kvforensics.agent.model.context import Context
    from kvforensics.agent.model.live import Inspection

HOST_RESERVE_BYTES = 10 << 30
# A HiCache tier at least this much host RAM per rank (decimal GB, as --hicache-size reads it).
MIN_HICACHE_GB = 4


@dataclass(frozen=True)
class HostOffload:
    """A HiCache tier this node could hold: host RAM per rank, the --hicache-size to pass, the KV tokens it holds."""

    ranks: int
    per_rank_bytes: int  # host RAM per rank after SGLang's 10 GiB reserve
    size_gb: int  # --hicache-size value: decimal GB per rank, rounded down
    tokens: int  # KV tokens that size holds per rank


def host_offload(insp: Inspection) -> Optional[HostOffload]:
    """HiCache sizing from host RAM now: (available − 10 GiB) // ranks on this host (SGLang 0.5.19+);
    None below MIN_HICACHE_GB per rank or MIN_GAIN_POOL_SHARE of the GPU pool (not worth enabling)."""
    a = insp.analysis
    avail = insp.host_memory.available_bytes
    if a is None or avail is None or a.failed is not None or not a.budget.cell_bytes:
        return None
    ranks = max(1, len(insp.engine_gpus) or len(a.ranks))
    per_rank = (avail - HOST_RESERVE_BYTES) // ranks
    size_gb = int(per_rank // 10**9)
    pool = a.summary.max_total_num_tokens
    tokens = size_gb * 10**9 // a.budget.cell_bytes
    if size_gb < MIN_HICACHE_GB or pool is None or not worth_it(tokens, pool):
        return None
    return HostOffload(ranks, per_rank, size_gb, tokens)


def host_ram_offload(ctx: "Context") -> Iterator[Finding]:
    insp = ctx.live
    off = host_offload(insp) if insp is not None else None
    if insp is None or off is None:
        return
    a = insp.analysis
    avail = insp.host_memory.available_bytes
    ratio = off.tokens / (a.summary.max_total_num_tokens or 1)
    enabled = bool(a.server_args.get("enable_hierarchical_cache"))
    title = "Host RAM could hold {:,} KV tokens per rank ({:.1f}× the GPU pool) as a HiCache tier".format(
        off.tokens, ratio)
    detail = ("{} host RAM available (MemAvailable{}), minus SGLang's 10 GiB host reserve, split over {} rank(s): "
              "{:.2f} GB each; --hicache-size {} (decimal GB, rounded down, as SGLang reads it) at {:,} "
              "B/token.{}").format(
                  gib(avail), ", cgroup-bounded" if insp.host_memory.cgroup_limit_bytes else "", off.ranks,
                  off.per_rank_bytes / 1e9, off.size_gb, a.budget.cell_bytes,
                  " HiCache is already enabled." if enabled else "")
    yield Finding(code="host_ram_offload", severity="info", title=title, detail=detail,
                  bytes=off.per_rank_bytes * off.ranks, evidence=("/proc/meminfo MemAvailable",))
