"""Recommendations: exact flags and values, with their gain in bytes, tokens and requests.

From a log alone every gain is "estimated": the startup headroom is measured, but the peak
free memory under load is not. On a live node the mem-fraction and HiCache advice rests on
measurement (NVML now, or ``kvforensics record``'s low-water mark). The margin kept free
(``--margin``, default 2 GiB) covers runtime activations not seen at startup.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from agent.node_rules import UNUSED_WARN_BYTES, headroom, host_offload
from agent.records import Recommendation
from agent.sglang.analysis import Analysis
from agent.sglang.budget import Budget
from collectors.units import gib

if TYPE_CHECKING:
    from agent.rulebook import Context

_HALF_PRECISION = ("bf16", "bfloat16", "float16", "fp16", "half", "auto", "torch.bfloat16", "torch.float16")


def gain_requests(a: Analysis, gain_tokens: int) -> Dict[str, Optional[int]]:
    """More requests that fit at once: at context_len and at --request-tokens (slot-capped)."""
    s = a.summary
    t = s.max_total_num_tokens
    if t is None:
        return {"at_context_len": None, "at_request_tokens": None}
    slots = s.max_running_requests or 10**9
    out: Dict[str, Optional[int]] = {}
    if s.context_len:
        out["at_context_len"] = min(slots, (t + gain_tokens) // s.context_len) - min(slots, t // s.context_len)
    else:
        out["at_context_len"] = None
    n = a.options.request_tokens
    out["at_request_tokens"] = min(slots, (t + gain_tokens) // n) - min(slots, t // n)
    return out


def mem_fraction_change(b: Budget, delta_bytes: int) -> Tuple[float, int, int]:
    """(new --mem-fraction-static, KV bytes gained, KV tokens gained) for moving the KV budget by
    at most ``delta_bytes`` (negative: give memory back).

    The budget moves by Δf × pre-load free (min over ranks); the value is rounded down to 3
    decimals (the precision SGLang's own defaults use) so a raise never exceeds the spare memory.
    """
    assert b.mfs is not None and b.pre_min_bytes and b.cell_bytes
    new = math.floor((b.mfs + delta_bytes / b.pre_min_bytes) * 1000) / 1000
    gain = int((new - b.mfs) * b.pre_min_bytes)
    tokens = gain // b.cell_bytes if gain >= 0 else -((-gain) // b.cell_bytes)
    return new, gain, tokens


def mem_fraction(ctx: "Context") -> Iterator[Recommendation]:
    """Raise --mem-fraction-static into unused memory, or lower it below the margin."""
    a = ctx.analysis
    if not isinstance(a, Analysis) or a.failed is not None:
        return
    if ctx.live is not None:
        yield from _measured_mem_fraction(ctx, a)
        return
    b = a.budget
    free, src = a.headroom()
    if free is None or b.mfs is None or not b.pre_min_bytes or not b.cell_bytes:
        return
    spare = free - a.options.margin_bytes
    if spare < UNUSED_WARN_BYTES:
        if spare < 0:
            yield _lower_mem_fraction(a, -spare, free, src)
        return
    new, gain, tokens = mem_fraction_change(b, spare)
    if gain <= 0:
        return
    draft_note = ""
    if a.budget.draft_in_budget:
        draft_note = " (bytes per token include the draft's KV, which grows with the target's)"
    yield Recommendation(
        "--mem-fraction-static", "{:.3f}".format(new), gain, tokens, "estimated",
        "{} free after startup ({}) − {} margin = {} spare; ({:.3f} − {:g}) × pre-load free {} = {} more KV"
        " = {:,} tokens at {:,} B/token{}. Estimated: the startup headroom is measured, the runtime peak is "
        "not (kvforensics record keeps low-water marks).".format(
            gib(free), src, gib(a.options.margin_bytes), gib(spare), new, b.mfs, gib(b.pre_min_bytes),
            gib(gain), tokens, b.cell_bytes, draft_note),
        gain_requests(a, tokens))


def _measured_mem_fraction(ctx: "Context", a: Analysis) -> Iterator[Recommendation]:
    b = a.budget
    found = headroom(ctx)
    if found is None or b.mfs is None or not b.pre_min_bytes or not b.cell_bytes:
        return
    spare = found.spare(ctx.options.margin_bytes)
    if not (spare >= UNUSED_WARN_BYTES or spare < 0):
        return
    new, gain, tokens = mem_fraction_change(b, spare)
    caveat = ("" if found.measured else " One look at the GPUs: under heavier load free memory can dip lower "
              "(kvforensics record keeps low-water marks).")
    yield Recommendation(
        "--mem-fraction-static", "{:.3f}".format(new), gain, tokens, "measured",
        "{} → {} {} keeping the {} margin → --mem-fraction-static {:.3f} ((Δ {:+.3f}) × pre-load free {} "
        "from the log) → {:+,} tokens per rank at {:,} B/token.{}".format(
            found.how, "reclaim" if spare >= 0 else "give back", gib(abs(spare)), gib(ctx.options.margin_bytes),
            new, new - b.mfs, gib(b.pre_min_bytes), tokens, b.cell_bytes, caveat),
        gain_requests(a, tokens))


def _lower_mem_fraction(a: Analysis, short: int, free: int, src: str) -> Recommendation:
    new, gain, tokens = mem_fraction_change(a.budget, -short)
    return Recommendation(
        "--mem-fraction-static", "{:.3f}".format(new), gain, tokens, "estimated",
        "Only {} free after startup ({}), below the {} margin: give {} back to runtime activations "
        "to avoid out-of-memory errors under load.".format(gib(free), src, gib(a.options.margin_bytes), gib(-gain)),
        gain_requests(a, tokens))


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
        "--kv-cache-dtype", "fp8_e4m3", 0, tokens, "estimated",
        "KV is stored in {} ({} B/token); FP8 halves that, so the same {} pool holds ~{:,} tokens instead of "
        "{:,}. Check quality on your evals and that the attention backend supports FP8 KV for this "
        "model.".format(resolved, a.budget.cell_bytes or r.target.bytes_per_token, gib(r.target.kv_bytes),
                        2 * tokens, tokens),
        gain_requests(a, tokens))


def hierarchical_cache(ctx: "Context") -> Iterator[Recommendation]:
    """A host-RAM KV tier: sized from measured host RAM on a live node, from the pool offline."""
    a = ctx.analysis
    if not isinstance(a, Analysis) or a.failed is not None:
        return
    if ctx.live is not None:
        off = host_offload(ctx.live)
        if off is not None and not a.server_args.get("enable_hierarchical_cache"):
            yield Recommendation(
                "--enable-hierarchical-cache --hicache-size", str(off.size_gb), None, off.tokens, "measured",
                "{} GB per rank of host RAM ({} ranks, SGLang's 10 GiB host reserve kept) holds {:,} tokens of "
                "prefix cache per rank. It keeps more context reusable (shared prefixes, multi-turn); it does not "
                "raise how many requests decode at once.".format(off.size_gb, off.ranks, off.tokens),
                {"at_context_len": 0, "at_request_tokens": 0})
        return
    args = a.server_args
    if args.get("enable_hierarchical_cache") or args.get("enable_hicache"):
        return
    r = next((x for x in a.ranks if x.target.kv_bytes is not None), None)
    t = a.summary.max_total_num_tokens
    if r is None or t is None or r.target.kv_bytes is None:
        return
    ratio = 2.0
    host_per_rank = int(r.target.kv_bytes * ratio)
    ranks = max(1, len(a.ranks))
    # --hicache-size is per rank and in decimal GB (mem_cache/memory_pool_host.py: size × 1e9).
    size_gb = math.ceil(host_per_rank / 1e9)
    yield Recommendation(
        "--enable-hierarchical-cache --hicache-size", str(size_gb), None, int(t * ratio), "estimated",
        "A host-RAM tier of {:.0f} GB per rank ({:.0f} GB for {} ranks, plus SGLang's 10 GiB host reserve) "
        "keeps ~{:,} more tokens of prefix cache. It does not add concurrent GPU requests: it saves "
        "recomputing shared prefixes and long multi-turn contexts. Host RAM is not visible in a log; "
        "`kvforensics inspect` on the node sizes this from measured free RAM.".format(
            host_per_rank / 1e9, host_per_rank * ranks / 1e9, ranks, int(t * ratio)),
        {"at_context_len": 0, "at_request_tokens": 0})


def max_running_requests(a: Analysis) -> Iterator[Recommendation]:
    s = a.summary
    if a.failed is not None or s.max_total_num_tokens is None or s.max_running_requests is None:
        return
    fit = s.max_total_num_tokens // a.options.request_tokens
    if fit <= s.max_running_requests:
        return
    yield Recommendation(
        "--max-running-requests", str(fit), 0, 0, "estimated",
        "The KV pool holds {:,} requests of {:,} tokens but only {:,} may run at once. Raising the limit "
        "uses the pool you already have; the req_to_token table grows by {} per extra slot.".format(
            fit, a.options.request_tokens, s.max_running_requests,
            gib(4 * (s.context_len or 0))),
        {"at_context_len": 0, "at_request_tokens": fit - s.max_running_requests})


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
    if saved < 64 << 20:
        return
    yield Recommendation(
        "--cuda-graph-max-bs", str(s.max_running_requests), saved, saved // a.budget.cell_bytes, "estimated",
        "Graphs are captured for batch sizes up to {} but at most {} requests run; {} of {} captured sizes "
        "can never be used. Graph memory scales roughly with the number of sizes: ~{} of {} freed, "
        "reclaimable with a higher --mem-fraction-static.".format(
            bs, s.max_running_requests, len(sizes) - len(kept), len(sizes), gib(saved), gib(r.target.graph_bytes)),
        gain_requests(a, saved // a.budget.cell_bytes))


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
            "--mem-fraction-static", "{:.2f}".format(new), int((new - floor) * b.pre_min_bytes), None, "estimated",
            "The minimum that leaves any KV budget is {:.4f}; {:.2f} gives the pool {}. If that is too small, "
            "spread the weights over more GPUs (--tp-size) or use a quantised checkpoint.".format(
                floor, new, gib((new - floor) * b.pre_min_bytes)))
    elif cause == "cuda_graph_capture_failed" or (cause == "cuda_out_of_memory" and f.stage == "graph_capture"):
        bs = a.server_args.get("cuda_graph_max_bs")
        value = str(max(1, bs // 2)) if isinstance(bs, int) else "a smaller value"
        yield Recommendation("--cuda-graph-max-bs", value, None, None, "estimated",
                             "Graph capture ran out of the reserve; fewer captured batch sizes need less. "
                             "Alternatively lower --mem-fraction-static by 0.02–0.05.")


def _on_startup(rec: Callable[[Analysis], Iterable[Recommendation]]) -> Callable[["Context"], Iterable[Recommendation]]:
    """A recommender over the startup analysis alone, the same offline and live."""
    def run(ctx: "Context") -> Iterable[Recommendation]:
        return rec(ctx.analysis) if isinstance(ctx.analysis, Analysis) else ()
    run.__name__ = rec.__name__
    return run


RECOMMENDERS = (_on_startup(startup_failure_fix), mem_fraction, _on_startup(max_running_requests),
                _on_startup(cuda_graph_max_bs), _on_startup(fp8_kv_cache), hierarchical_cache)
