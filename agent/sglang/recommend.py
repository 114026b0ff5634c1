"""Recommendations: exact flags and values, with their gain in bytes, tokens and requests.

From a log alone every gain is "estimated": the startup headroom is measured, but the peak
free memory under load is not. On a live node the mem-fraction advice is "measured" only when
``kvforensics record``'s history of the engine run is long enough (``node_rules.is_measured``);
one look at NVML or at host RAM is an estimate. The margin kept free (``--margin``, default
2 GiB) covers runtime activations not seen at startup. A change that gains too little is not
advised (``node_rules.worth_it``, ``MIN_HICACHE_GB``). The order of ``RECOMMENDERS`` is the
order of advice: the first recommendation is the report's best action.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Dict, Iterable, Iterator, List, Optional

from kvforensics.agent.model.node_rules import Spare, spare_memory, worth_it
from kvforensics.agent.model.node_rules import gain_requests as node_gain_requests
from kvforensics.agent.model.records import Recommendation
from kvforensics.agent.sglang.analysis import Analysis
from kvforensics.agent.sglang.hicache import MIN_HICACHE_GB, host_offload
from kvforensics.collectors.units import gib

if TYPE_CHECKING:
    from kvforensics.agent.model.context import Context

_HALF_PRECISION = ("bf16", "bfloat16", "float16", "fp16", "half", "auto", "torch.bfloat16", "torch.float16")


def gain_requests(a: Analysis, gain_tokens: int) -> Dict[str, Optional[int]]:
    """More requests that fit at once: at context_len and at --request-tokens (slot-capped)."""
    s = a.summary
    return node_gain_requests(s.max_total_num_tokens, gain_tokens, s.context_len, a.options.request_tokens,
                              s.max_running_requests)


def mem_fraction(ctx: "Context") -> Iterator[Recommendation]:
    """Raise --mem-fraction-static into unused memory, or lower it below the margin: the change the
    unused_gpu_memory finding quotes (one computation, ``node_rules.spare_memory``)."""
    a = ctx.analysis
    if not isinstance(a, Analysis) or a.failed is not None:
        return
    found = spare_memory(ctx)
    if found is None or found.change is None:
        return
    if found.cut_advised:
        yield _lower_mem_fraction(ctx, a, found)
    elif found.worth_it and found.change.gain_bytes > 0:
        rec = _measured_raise(ctx, a, found) if ctx.live is not None else _estimated_raise(a, found)
        unified = unified_memory_gpu(ctx)
        if unified is None:
            yield rec
            return
        host = _host_keeps(ctx, unified, found.change.gain_bytes)
        if host is not None:  # never advised without what the host keeps
            yield replace(rec, rationale=rec.rationale + " " + host)


def unified_memory_gpu(ctx: "Context") -> Optional[int]:
    """The index of an engine GPU whose NVML reports no framebuffer figures (no total, no free): a
    unified-memory GPU (GB10 / DGX Spark), where SGLang's "free GPU memory" is the host's available RAM
    (get_available_gpu_memory: psutil.virtual_memory().available when props.is_integrated,
    utils/common.py, sglang 0.5.18). Every engine GPU must lack them: one discrete GPU whose memory query
    failed beside others that answer is a fault, not unified memory. None off a live node or on discrete GPUs."""
    live = ctx.live
    if live is None:
        return None
    gpus = live.engine_gpus or live.gpus
    if not gpus or any(g.status == "lost" or g.total_bytes is not None or g.free_bytes is not None for g in gpus):
        return None
    return gpus[0].index


def _host_keeps(ctx: "Context", gpu: int, gain_bytes: int) -> Optional[str]:
    """What a raise leaves the host on unified memory; None when host memory is not known."""
    assert ctx.live is not None
    available = ctx.live.host_memory.available_bytes
    if available is None:
        return None
    return ("Unified memory (GPU {} reports no framebuffer figures, e.g. GB10 / DGX Spark): the KV pool is host "
            "RAM, so this raise takes {} from the host, which keeps {} available of {} now.").format(
        gpu, gib(gain_bytes), gib(max(0, available - gain_bytes)), gib(available))


def _estimated_raise(a: Analysis, found: Spare) -> Recommendation:
    b, c, h = a.budget, found.change, found.headroom
    assert c is not None and b.mfs is not None
    draft_note = ""
    if b.draft_in_budget:
        draft_note = " (bytes per token include the draft's KV, which grows with the target's)"
    return Recommendation(
        flag=c.flag, value=c.value, gain_bytes=c.gain_bytes, gain_tokens=c.gain_tokens, basis="estimated",
        rationale="{} free after startup ({}) − {} margin = {} spare; ({} − {:g}) × pre-load free {} = {} more KV"
        " = {:,} tokens at {:,} B/token{}. {}. Estimated: the startup headroom is measured, the runtime peak is "
        "not (kvforensics record keeps low-water marks).".format(
            gib(h.free_bytes), h.how, gib(a.options.margin_bytes), gib(found.spare_bytes), c.value, b.mfs,
            gib(b.pre_min_bytes), gib(c.gain_bytes), c.gain_tokens, b.cell_bytes, draft_note, c.rounding),
        gain_requests=gain_requests(a, c.gain_tokens), fixes="unused_gpu_memory")


def _measured_raise(ctx: "Context", a: Analysis, found: Spare) -> Recommendation:
    """Live: ``measured`` only when a recorded history long enough backs the low-water mark."""
    b, c, h = a.budget, found.change, found.headroom
    assert c is not None and b.mfs is not None
    caveat = ("" if h.measured else " Under heavier load free memory can dip lower (kvforensics record keeps "
              "low-water marks).")
    return Recommendation(
        flag=c.flag, value=c.value, gain_bytes=c.gain_bytes, gain_tokens=c.gain_tokens,
        basis="measured" if h.measured else "estimated",
        rationale="{} → reclaim {} keeping the {} margin → {} {} ((Δ {:+.3f}) × pre-load free {} from the log = {}; "
        "{}) → {:+,} tokens per rank at {:,} B/token.{}".format(
            h.how, gib(found.spare_bytes), gib(ctx.options.margin_bytes), c.flag, c.value,
            float(c.value) - b.mfs, gib(b.pre_min_bytes), gib(c.gain_bytes), c.rounding, c.gain_tokens,
            b.cell_bytes, caveat), gain_requests=gain_requests(a, c.gain_tokens), fixes="unused_gpu_memory")


def _lower_mem_fraction(ctx: "Context", a: Analysis, found: Spare) -> Recommendation:
    c, h = found.change, found.headroom
    assert c is not None
    where = "free after startup ({})".format(h.how) if ctx.live is None else "free ({})".format(h.how)
    return Recommendation(
        flag=c.flag, value=c.value, gain_bytes=c.gain_bytes, gain_tokens=c.gain_tokens,
        basis="measured" if h.measured else "estimated",
        rationale="Only {} {}, below the {} margin, and {}: give {} back to runtime activations to avoid "
        "out-of-memory errors under load.".format(gib(h.free_bytes), where, gib(ctx.options.margin_bytes),
                                                  found.pressure, gib(-c.gain_bytes)),
        gain_requests=gain_requests(a, c.gain_tokens), fixes="low_headroom")


def fp8_kv_cache(a: Analysis) -> Iterator[Recommendation]:
    r = next((x for x in a.ranks if x.target.kv_bytes is not None), None)
    if a.failed is not None or r is None or a.summary.max_total_num_tokens is None:
        return
    logged = next((e.data["dtype"] for e in a.attributed.other if e.kind == "kv_dtype"), None)
    dtype = r.target.kv_dtype or logged or a.server_args.get("kv_cache_dtype") or "auto"
    resolved = a.geometry.dtype if a.geometry else str(dtype).replace("torch.", "")
    if resolved not in _HALF_PRECISION:
        return
    if r.target.bytes_per_token is None and a.budget.cell_bytes is None:
        return
    tokens = a.summary.max_total_num_tokens  # half the bytes per token: the same pool holds twice as many
    yield Recommendation(
        flag="--kv-cache-dtype", value="fp8_e4m3", gain_bytes=0, gain_tokens=tokens, basis="estimated",
        rationale="KV is stored in {} ({} B/token); FP8 halves that, so the same {} pool holds ~{:,} tokens instead of "
        "{:,}. Check quality on your evals and that the attention backend supports FP8 KV for this "
        "model.".format(resolved, a.budget.cell_bytes or r.target.bytes_per_token, gib(r.target.kv_bytes),
                        2 * tokens, tokens), gain_requests=gain_requests(a, tokens),
        fixes="concurrency_bound" if _tokens_bind(a) else "")


def _tokens_bind(a: Analysis) -> bool:
    """KV tokens, not request slots, bound concurrency (node_rules.concurrency_bound's test): more tokens help."""
    s = a.summary
    t, r = s.max_total_num_tokens, s.max_running_requests
    return t is not None and (r is None or t // a.options.request_tokens < r)


HICACHE_POOL_RATIO = 2  # offline, the host tier is sized at twice the GPU pool (host RAM is not in a log)


def hierarchical_cache(ctx: "Context") -> Iterator[Recommendation]:
    """A host-RAM KV tier: sized from host RAM now on a live node, from the pool offline. Only a
    tier of at least MIN_HICACHE_GB per rank that adds MIN_GAIN_POOL_SHARE of the pool is advised."""
    a = ctx.analysis
    if not isinstance(a, Analysis) or a.failed is not None:
        return
    if a.server_args.get("enable_hierarchical_cache") or a.server_args.get("enable_hicache"):
        return
    if ctx.live is not None:
        off = host_offload(ctx.live)
        if off is not None:
            yield Recommendation(
                flag="--enable-hierarchical-cache --hicache-size", value=str(off.size_gb), gain_bytes=None,
                gain_tokens=off.tokens, basis="estimated",
                rationale="{} GB per rank of host RAM ({} ranks, SGLang's 10 GiB host reserve kept; one look at "
                "MemAvailable) holds {:,} tokens of prefix cache per rank. It keeps more context reusable (shared "
                "prefixes, multi-turn); it does not raise how many requests decode at once.".format(
                    off.size_gb, off.ranks, off.tokens), gain_requests={"at_context_len": 0, "at_request_tokens": 0})
        return
    yield from _offline_hicache(a)


def _offline_hicache(a: Analysis) -> Iterator[Recommendation]:
    r = next((x for x in a.ranks if x.target.kv_bytes is not None), None)
    t = a.summary.max_total_num_tokens
    if r is None or t is None or r.target.kv_bytes is None:
        return
    host_per_rank = r.target.kv_bytes * HICACHE_POOL_RATIO
    # --hicache-size is per rank and in decimal GB (mem_cache/memory_pool_host.py: size × 1e9);
    # every figure below is that value's, so the text and the flag say the same size.
    size_gb = math.ceil(host_per_rank / 1e9)
    cell = a.budget.cell_bytes
    tokens = size_gb * 10**9 // cell if cell else t * HICACHE_POOL_RATIO
    ranks = max(1, len(a.ranks))
    if size_gb < MIN_HICACHE_GB or not worth_it(tokens, t):
        return
    yield Recommendation(
        flag="--enable-hierarchical-cache --hicache-size", value=str(size_gb), gain_bytes=None, gain_tokens=tokens,
        basis="estimated",
        rationale="A host-RAM tier of {} GB per rank (decimal GB, as --hicache-size reads it: {}× the {} GPU pool = "
        "{:.2f} GB, rounded up), {} GB for {} ranks plus SGLang's 10 GiB host reserve, keeps ~{:,} more tokens of "
        "prefix cache per rank. It does not add concurrent GPU requests: it saves recomputing shared prefixes and long "
        "multi-turn contexts. Host RAM is not visible in a log; `kvforensics inspect` on the node sizes this "
        "from the free RAM there.".format(size_gb, HICACHE_POOL_RATIO, gib(r.target.kv_bytes), host_per_rank / 1e9,
                                          size_gb * ranks, ranks, tokens),
        gain_requests={"at_context_len": 0, "at_request_tokens": 0})


def _mamba_ratio(a: Analysis) -> int:
    """Mamba state slots per running request: 1 with --disable-radix-cache, else 3, plus 1-2 with the
    extra_buffer strategy (init_memory_pool, model_runner_kv_cache_mixin.py, sglang 0.5.8)."""
    return 1 if a.server_args.get("disable_radix_cache") is True else 3


def _mamba_slot_cap(a: Analysis) -> Optional[int]:
    """Hybrid Mamba models: SGLang clamps max_running_requests to max_mamba_cache_size // _mamba_ratio.
    0 when the log shows a Mamba pool without its size: the cap is unknown, so no limit can be advised.
    None: no Mamba pool."""
    pools = [e for r in a.attributed.ranks for e in r.target.all("mamba_pool")]
    if not pools:
        return None
    sizes = [e.data["max_size"] for e in pools if e.data.get("max_size")]
    if len(sizes) < len(pools):
        return 0
    return min(sizes) // _mamba_ratio(a)


def max_running_requests(a: Analysis) -> Iterator[Recommendation]:
    s = a.summary
    if a.failed is not None or s.max_total_num_tokens is None or s.max_running_requests is None:
        return
    held = s.max_total_num_tokens // a.options.request_tokens
    cap = _mamba_slot_cap(a)
    fit = held if cap is None else min(held, cap)
    if fit <= s.max_running_requests:
        return
    mamba = "" if cap is None else (
        " The Mamba state pool caps it at {:,} (max_mamba_cache_size // {}, SGLang's own clamp; lower still with "
        "--mamba-scheduler-strategy extra_buffer): more needs --max-mamba-cache-size, which takes memory from the "
        "KV pool.".format(cap, _mamba_ratio(a)))
    yield Recommendation(
        flag="--max-running-requests", value=str(fit), gain_bytes=0, gain_tokens=0, basis="estimated",
        rationale="The KV pool holds {:,} requests of {:,} tokens but only {:,} may run at once. Raising the limit "
        "uses the pool you already have; the req_to_token table grows by {} per extra slot.{}".format(
            held, a.options.request_tokens, s.max_running_requests,
            gib(4 * s.context_len) if s.context_len else "4 B × context_len", mamba),
        gain_requests={"at_context_len": 0, "at_request_tokens": fit - s.max_running_requests},
        fixes="concurrency_bound")


def cuda_graph_max_bs(a: Analysis) -> Iterator[Recommendation]:
    s = a.summary
    bs = a.server_args.get("cuda_graph_max_bs")
    r = next((x for x in a.ranks if x.target.graph_bytes), None)
    if a.failed is not None or r is None or not isinstance(bs, int) or s.max_running_requests is None:
        return
    if bs <= s.max_running_requests:
        return
    sizes: List[int] = []
    for ev in (e for rank in a.attributed.ranks for e in rank.target.events):
        if ev.data.get("batch_sizes"):
            sizes = list(ev.data["batch_sizes"])
            break
    if not sizes or not r.target.graph_bytes or not a.budget.cell_bytes:
        return
    kept = [x for x in sizes if x <= s.max_running_requests]
    saved = int(r.target.graph_bytes * (1 - len(kept) / len(sizes)))
    if saved < 64 << 20 or not worth_it(saved // a.budget.cell_bytes, s.max_total_num_tokens):
        return
    yield Recommendation(
        flag="--cuda-graph-max-bs", value=str(s.max_running_requests), gain_bytes=saved,
        gain_tokens=saved // a.budget.cell_bytes, basis="estimated",
        rationale="Graphs are captured for batch sizes up to {} but at most {} requests run; {} of {} captured sizes "
        "can never be used. Graph memory scales roughly with the number of sizes: ~{} of {} freed, "
        "reclaimable with a higher --mem-fraction-static.".format(
            bs, s.max_running_requests, len(sizes) - len(kept), len(sizes), gib(saved), gib(r.target.graph_bytes)),
        gain_requests=gain_requests(a, saved // a.budget.cell_bytes))


def startup_failure_fix(a: Analysis) -> Iterator[Recommendation]:
    f = a.failed
    b = a.budget
    if f is None:
        return
    cause = f.cause
    if cause in ("not_enough_memory", "weights_leave_no_memory", "no_kv_budget") and b.pre_min_bytes \
            and b.post_min_bytes:
        floor = 1 - b.post_min_bytes / b.pre_min_bytes
        new = math.ceil((floor + 0.02) * 100) / 100
        yield Recommendation(
            flag="--mem-fraction-static", value="{:.2f}".format(new), gain_bytes=int((new - floor) * b.pre_min_bytes),
            gain_tokens=None, basis="estimated",
            rationale="The minimum that leaves any KV budget is {:.4f}; {:.2f} gives the pool {}. If that is too "
            "small, spread the weights over more GPUs (--tp-size) or use a quantised checkpoint.".format(
                floor, new, gib((new - floor) * b.pre_min_bytes)), fixes="startup_failed")
    elif cause == "cuda_graph_capture_failed" or (cause == "cuda_out_of_memory" and f.stage == "graph_capture"):
        bs = a.server_args.get("cuda_graph_max_bs")
        value = str(max(1, bs // 2)) if isinstance(bs, int) else "a smaller value"
        yield Recommendation(flag="--cuda-graph-max-bs", value=value, gain_bytes=None, gain_tokens=None,
                             basis="estimated",
                             rationale="Graph capture ran out of the reserve; fewer captured batch sizes need less. "
                             "Alternatively lower --mem-fraction-static by 0.02–0.05.", fixes="startup_failed")


def _on_startup(rec: Callable[[Analysis], Iterable[Recommendation]]) -> Callable[["Context"], Iterable[Recommendation]]:
    """A recommender over the startup analysis alone, the same offline and live."""
    def run(ctx: "Context") -> Iterable[Recommendation]:
        return rec(ctx.analysis) if isinstance(ctx.analysis, Analysis) else ()
    run.__name__ = rec.__name__
    return run


RECOMMENDERS = (_on_startup(startup_failure_fix), mem_fraction, _on_startup(max_running_requests),
                _on_startup(cuda_graph_max_bs), _on_startup(fp8_kv_cache), hierarchical_cache)
