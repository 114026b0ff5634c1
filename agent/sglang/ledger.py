"""Per-rank memory ledger from a startup log: where each rank's free memory went.

Every figure is int bytes and carries its source (a log line, or a formula with its inputs),
so the report can say where each number came from. Figures the log does not give are None.

The ledger starts from the free memory SGLang measured just before loading weights
("Load weight begin. avail mem") and ends at the last free figure the rank printed (the
scheduler summary's ``available_gpu_mem`` on the rank that prints it, else the last capture
line). In between, each item is a logged usage or a computed allocation; what the log's
own free figures say went missing beyond the items is the unexplained remainder.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from kvforensics.agent.model.citing import where
from kvforensics.agent.sglang.attribution import Attributed, RankEvents, RunnerEvents, pool_key
from kvforensics.collectors.events import LogEvent


@dataclass(frozen=True)
class RunnerLedger:
    """One model runner (target or draft) on one rank. Sizes in bytes."""

    dist_init_bytes: Optional[int] = None
    pre_load_avail_bytes: Optional[int] = None
    weights_bytes: Optional[int] = None
    post_load_avail_bytes: Optional[int] = None
    kv_tokens: Optional[int] = None
    kv_bytes: Optional[int] = None
    bytes_per_token: Optional[int] = None
    pool_end_avail_bytes: Optional[int] = None
    graph_bytes: Optional[int] = None
    graph_end_avail_bytes: Optional[int] = None
    mamba_bytes: Optional[int] = None
    workspace_bytes: Optional[int] = None
    model_type: Optional[str] = None
    kv_dtype: Optional[str] = None
    sources: Dict[str, str] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """What this runner itself holds (weights, KV, Mamba state, graphs, workspaces)."""
        return sum(x or 0 for x in (self.weights_bytes, self.kv_bytes, self.mamba_bytes,
                                    self.graph_bytes, self.workspace_bytes))


@dataclass(frozen=True)
class RankLedger:
    """One rank's ledger: its target and draft runners, the reserve, req_to_token, the last free figure and what is
    unexplained. Sizes in bytes; None: the log does not give it."""

    rank: str
    target: RunnerLedger
    draft: Optional[RunnerLedger]
    reserve_bytes: Optional[int]  # pre-load free (min over ranks) × (1 − mem_fraction_static)
    req_to_token_bytes: Optional[int]
    final_avail_bytes: Optional[int]
    unexplained_bytes: Optional[int]
    sources: Dict[str, str] = field(default_factory=dict)


def runner_ledger(runner: RunnerEvents, page_size: int, swa_split: Optional[LogEvent] = None) -> RunnerLedger:
    figures = _Figures()
    _weights(figures, runner)
    _kv(figures, runner, page_size, swa_split)
    _mamba(figures, runner)
    _after_pools(figures, runner)
    return RunnerLedger(sources=figures.sources, **figures.values)  # type: ignore[arg-type]


class _Figures:
    """A runner's figures as its lines are read, each sized one with where it came from (the model
    type and the KV dtype are labels, set in ``values`` directly)."""

    def __init__(self) -> None:
        self.values: Dict[str, object] = {}
        self.sources: Dict[str, str] = {}

    def put(self, name: str, value: object, ev: Optional[LogEvent], how: str = "") -> None:
        """A figure from a line, cited as 'line N: how'; a figure the line lacks (None) is left out."""
        if value is None:
            return
        self.values[name] = value
        self.sources[name] = (where(ev) + (": " + how if how else "")).strip(": ")


def _weights(figures: _Figures, runner: RunnerEvents) -> None:
    """Distributed init and the weights: the free memory before and after they load, and their size."""
    dist = runner.first("dist_init_end")
    figures.put("dist_init_bytes", dist and dist.data.get("used_bytes"), dist, "Init … ends, mem usage")
    begin, end = runner.first("load_begin"), runner.first("load_end")
    pre = begin.data["avail_bytes"] if begin else None
    figures.put("pre_load_avail_bytes", pre, begin, "Load weight begin, avail mem")
    if end is None:
        return
    post = end.data["avail_bytes"]
    figures.put("post_load_avail_bytes", post, end, "Load weight end, avail mem")
    figures.values["model_type"] = end.data.get("model_type")
    if end.data.get("used_bytes") is not None:
        figures.put("weights_bytes", end.data["used_bytes"], end, "Load weight end, mem usage")
    elif pre is not None:
        figures.put("weights_bytes", pre - post, end, "avail before − after load ({})".format(where(begin)))


def _kv(figures: _Figures, runner: RunnerEvents, page_size: int, swa_split: Optional[LogEvent]) -> None:
    """The KV pool: 0.5.18+ post-capture sizing's final pool replaces the VA bound the pool lines print."""
    post_capture = runner.first("post_capture_kv")
    if post_capture is not None:
        figures.put("kv_tokens", post_capture.data["tokens"], post_capture, "Post-capture KV sizing, #tokens")
        figures.put("kv_bytes", post_capture.data["kv_bytes"], post_capture, "Post-capture KV sizing, KV size")
        figures.values["kv_dtype"] = post_capture.data.get("dtype")
        return
    pools = runner.all("kv_pool")
    swa_total = runner.first("swa_pool")
    if swa_total is not None:
        _kv_swa_total(figures, swa_total, pools)
    elif pools and all(pool_key(p, swa_split) == "SWA" for p in pools):
        _kv_swa_half(figures, pools, swa_split)
    elif pools:
        _kv_pools(figures, pools, page_size, swa_split)


def _kv_swa_total(figures: _Figures, total: LogEvent, pools: List[LogEvent]) -> None:
    """A hybrid sliding-window pool's own total, 'SWAKVPool mem usage: X GB, swa size: S, full size: F',
    printed after both halves' lines and equal to their sum (SWAKVPool.__init__: get_kv_size_bytes
    adds the full and SWA pools; memory_pool.py, sglang 0.5.6.post2; swa_memory_pool.py, 0.5.8). It
    still counts when a fragment starts after the SWA half's line. F is max_total_num_tokens."""
    figures.put("kv_tokens", total.data.get("full_tokens"), total, "SWAKVPool mem usage, full size")
    figures.put("kv_bytes", total.data["bytes"], total, "SWAKVPool mem usage (both halves)")
    if pools:
        figures.values["kv_dtype"] = pools[0].data.get("dtype")


def _kv_swa_half(figures: _Figures, pools: List[LogEvent], swa_split: Optional[LogEvent]) -> None:
    """Only the sliding-window half's line of a hybrid pool is in the log (the full-attention half's
    line follows it, SWAKVPool.__init__, swa_memory_pool.py, sglang 0.5.8, and was cut): its bytes are
    not the pool's, so the size stays unknown; the full-attention count comes from the split line."""
    split = swa_split.data.get("full_tokens") if swa_split is not None else None
    figures.put("kv_tokens", split, swa_split, "Use sliding window memory pool, full_layer_tokens")
    figures.values["kv_dtype"] = pools[0].data.get("dtype")


def _kv_pools(figures: _Figures, pools: List[LogEvent], page_size: int, swa_split: Optional[LogEvent]) -> None:
    """The KV pool lines: the full-attention pool's #tokens (SGLang's max_total_num_tokens; a hybrid
    sliding-window pool's SWA half is not it), every pool's bytes (hybrid models print one line
    per pool), and the bytes per token when one pool holds them all."""
    first = next((p for p in pools if pool_key(p, swa_split) != "SWA"), pools[0])
    tokens = first.data.get("tokens")
    figures.put("kv_tokens", tokens, first, "KV Cache is allocated, #tokens")
    kv = sum(p.data["kv_bytes"] for p in pools)
    lines = ", ".join(where(p) for p in pools)
    figures.put("kv_bytes", kv, pools[-1], "sum of {} KV pool line(s) ({})".format(len(pools), lines)
                if len(pools) > 1 else "KV Cache is allocated, K+V / KV size")
    figures.values["kv_dtype"] = first.data.get("dtype")
    if tokens and len(pools) == 1:
        # The buffers have size + page_size rows (row 0 pads), memory_pool.py.
        figures.put("bytes_per_token", int(round(kv / (tokens + page_size))), first,
                    "KV size / (#tokens + page_size {}), ±0.005 GiB print rounding".format(page_size))


def _mamba(figures: _Figures, runner: RunnerEvents) -> None:
    mamba = runner.all("mamba_pool")
    if mamba:
        total = sum((m.data["conv_bytes"] or 0) + (m.data["ssm_bytes"] or 0) + m.data["intermediate_bytes"]
                    for m in mamba)
        figures.put("mamba_bytes", total, mamba[0], "Mamba Cache is allocated, conv + ssm state")


def _after_pools(figures: _Figures, runner: RunnerEvents) -> None:
    """The free memory at the pool's end, the CUDA graphs' memory, and the free memory after them."""
    pool_end = runner.first("pool_end")
    figures.put("pool_end_avail_bytes", pool_end and pool_end.data["avail_bytes"], pool_end, "Memory pool end")
    ends = [g for g in runner.all("graph_end") if g.data.get("used_bytes") is not None]
    if ends:
        figures.put("graph_bytes", sum(g.data["used_bytes"] for g in ends), ends[-1],
                    "sum of {} Capture … end mem usage ({})".format(len(ends), ", ".join(where(g) for g in ends)))
    last_avail = [g for g in runner.all("graph_end") if g.data.get("avail_bytes") is not None]
    if last_avail:
        figures.put("graph_end_avail_bytes", last_avail[-1].data["avail_bytes"], last_avail[-1],
                    "last Capture … end avail")


def last_avail(rank: RankEvents, summary: Optional[LogEvent]) -> Tuple[Optional[int], Optional[LogEvent]]:
    """The rank's last free-memory figure, preferring its own scheduler summary line."""
    if summary is not None and summary.data.get("avail_bytes") is not None:
        return summary.data["avail_bytes"], summary
    best: Optional[LogEvent] = None
    for ev in rank.target.events + rank.draft.events:
        if ev.data.get("avail_bytes") is not None and (best is None or _order(ev) >= _order(best)):
            best = ev
    return (best.data["avail_bytes"], best) if best else (None, None)


def _order(ev: LogEvent) -> Tuple[int, int]:
    return (ev.offset, ev.line or 0)


def _workspace(rank: RankEvents, runner: RunnerEvents, ledger: RunnerLedger) -> RunnerLedger:
    """Attention workspaces: the free memory lost between the last checkpoint before a runner's
    first graph capture and that capture.

    The checkpoint may be the other runner's: 0.5.14+ logs target KV, pool end, draft KV, pool
    end, then target graphs, so the target's own ``Memory pool end`` would count the draft KV
    too. ≤0.5.13 is sequential and the checkpoint is the runner's own pool end.
    """
    first = next((g for g in runner.all("graph_begin") if g.data.get("avail_bytes") is not None), None)
    if first is None:
        return ledger
    checkpoints = [e for e in rank.target.events + rank.draft.events
                   if e.kind in ("pool_end", "graph_end", "load_end") and e.data.get("avail_bytes") is not None
                   and _order(e) < _order(first)]
    if not checkpoints:
        return ledger
    prev = max(checkpoints, key=_order)
    if prev.kind != "pool_end":  # a gap after graphs or weights is not the attention workspaces
        return replace(ledger, workspace_bytes=None,
                       sources={k: v for k, v in ledger.sources.items() if k != "workspace_bytes"})
    gap = prev.data["avail_bytes"] - first.data["avail_bytes"]
    if gap < 0:
        return ledger
    sources = dict(ledger.sources)
    sources["workspace_bytes"] = ("{}: attention workspaces: last Memory pool end ({}) − first Capture … begin "
                                  "avail").format(
        where(first), where(prev))
    return replace(ledger, workspace_bytes=gap, sources=sources)


def rank_ledger(rank: RankEvents, page_size: int, reserve: Optional[int], reserve_src: str,
                req_to_token: Optional[int], req_src: str, summary: Optional[LogEvent]) -> RankLedger:
    target = _workspace(rank, rank.target, runner_ledger(rank.target, page_size, rank.swa_split))
    draft = _workspace(rank, rank.draft, runner_ledger(rank.draft, page_size)) if rank.has_draft else None
    final, final_ev = last_avail(rank, summary)
    sources: Dict[str, str] = {}
    if reserve is not None:
        sources["reserve_bytes"] = reserve_src
    if req_to_token is not None:
        sources["req_to_token_bytes"] = req_src
    if final is not None:
        sources["final_avail_bytes"] = where(final_ev)
    unexplained = None
    pre = target.pre_load_avail_bytes
    if pre is not None and final is not None and target.weights_bytes is not None:
        items: List[int] = [target.total_bytes, req_to_token or 0]
        if draft is not None:
            items.append(draft.total_bytes)
        unexplained = pre - final - sum(items)
        sources["unexplained_bytes"] = ("pre-load free − final free − every item above "
                                        "(allocator cache, pool metadata, CUDA/NCCL buffers)")
    return RankLedger(rank=rank.rank, target=target, draft=draft, reserve_bytes=reserve,
                      req_to_token_bytes=req_to_token, final_avail_bytes=final, unexplained_bytes=unexplained,
                      sources=sources)


def ledgers(attributed: Attributed, page_size: int, reserve: Optional[int], reserve_src: str,
            req_to_token: Optional[int], req_src: str) -> Tuple[RankLedger, ...]:
    out = []
    for rank in attributed.ranks:
        summary = next((s for s in attributed.summaries if s.rank == rank.rank), None)
        out.append(rank_ledger(rank, page_size, reserve, reserve_src, req_to_token, req_src, summary))
    return tuple(out)
