"""vLLM recommendations: exact flags, only where the log gives the numbers (estimated from a log)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional

from kvforensics.agent.model.node_rules import Spare, gain_requests, live_sizing, spare_memory
from kvforensics.agent.model.records import Recommendation
from kvforensics.agent.vllm.analysis import Analysis
from kvforensics.collectors.units import gib

if TYPE_CHECKING:
    from kvforensics.agent.model.context import Context


def on_failure(ctx: "Context") -> Iterator[Recommendation]:
    a = ctx.analysis
    if not isinstance(a, Analysis) or a.failed is None:
        return
    f = a.failed
    d = f.data
    if f.cause == "max_model_len_too_large" and d.get("fits_tokens"):
        yield Recommendation(flag="--max-model-len", value=str(d["fits_tokens"]), gain_bytes=None, gain_tokens=None,
                             basis="estimated",
                             rationale="vLLM's own figure ({}): {:,} tokens fit in the KV cache, max_model_len {:,} "
                             "does not.".format(f.where, d["fits_tokens"], d["max_model_len"]), fixes="startup_failed")
        if str(a.kv_cache_dtype).lower() in ("bfloat16", "float16", "half", "bf16", "fp16"):
            yield Recommendation(flag="--kv-cache-dtype", value="fp8", gain_bytes=None, gain_tokens=None,
                                 basis="estimated",
                                 rationale="An 8-bit KV cache holds about twice the tokens of a 16-bit one in the same "
                                 "memory (quality cost is model-dependent).", fixes="startup_failed")
    elif f.cause == "insufficient_free_memory" and d.get("total_bytes"):
        u = math.floor(d["free_bytes"] / d["total_bytes"] * 100) / 100
        yield Recommendation(flag="--gpu-memory-utilization", value="{:.2f}".format(u), gain_bytes=None,
                             gain_tokens=None, basis="estimated",
                             rationale="Free {} of {} at worker start ({}): the largest budget that passes the check "
                             "is free / total; or free the memory other processes hold.".format(
                                 gib(d["free_bytes"]), gib(d["total_bytes"]), f.where), fixes="startup_failed")
    elif f.cause == "cuda_out_of_memory" and f.stage == "graph_capture" and a.era.graphs_inside is False:
        yield Recommendation(flag="--enforce-eager", value="", gain_bytes=None, gain_tokens=None, basis="estimated",
                             rationale="The OOM came during CUDA graph capture, which in this era sits outside the "
                             "budget; eager mode needs no graph memory (or lower --gpu-memory-utilization by the "
                             "graph size).", fixes="startup_failed")


def resize_utilization(ctx: "Context") -> Iterator[Recommendation]:
    """Memory no budget covers, beyond the margin, into the budget (measured on a live node: NVML, or
    the run's low-water mark; else estimated from the startup's figures); or, below the margin, the
    budget lowered by the shortfall so runtime growth (NCCL, allocator fragments) has room. Its tokens are
    vLLM's own count per byte of KV memory (``Analysis.kv_capacity``)."""
    a = ctx.analysis
    if not isinstance(a, Analysis) or a.failed is not None:
        return
    found = spare_memory(ctx)
    if found is None or (not found.worth_it and not found.cut_advised) or (found.spare_bytes < 0
                                                                            and not found.cut_advised):
        return
    h = found.headroom
    cuda_total, flags = live_sizing(ctx, h)  # what spare_memory sized its change with: one computation
    moved = a.utilization_for(found.spare_bytes, cuda_total, flags)
    if moved is None or (moved[1] > 0) != (found.spare_bytes > 0):
        return
    new, gain = moved
    tokens = a.kv_tokens_for(gain)
    cap = a.kv_capacity()
    yield Recommendation(flag="--gpu-memory-utilization", value="{:.2f}".format(new), gain_bytes=gain,
                         gain_tokens=tokens, basis="measured" if h.measured else "estimated",
                         rationale=_resize_rationale(ctx, a, found, new, gain, cuda_total, flags),
                         gain_requests=gain_requests(cap[0] if cap else None, tokens or 0, a.max_model_len,
                                                     a.options.request_tokens, _slots(a)),
                         fixes="unused_gpu_memory" if gain > 0 else "low_headroom")


def _resize_rationale(ctx: "Context", a: Analysis, found: Spare, new: float, gain: int, cuda_total: Optional[int],
                      flags: Optional[Dict[str, Any]]) -> str:
    """The arithmetic from the free memory to the value and its gain, with the one rounding said where it is
    applied: free − margin = spare; u + spare ÷ T, rounded down to 0.01; (new − u) × T = the budget's move."""
    h, margin = found.headroom, a.options.margin_bytes
    got = a.fraction(flags or {})
    w = a.sized_worker()
    total = cuda_total or (w.total_gpu_bytes if w is not None else None)
    assert got is not None and total
    u = got[0]
    free = gib(h.free_bytes) + (" free" if ctx.live is not None else " outside the budget after startup")
    if gain > 0:
        spare = "{} ({}) − {} margin = {} spare".format(free, h.how, gib(margin), gib(found.spare_bytes))
        step = "u {:g} + {} ÷ T {} ≈ {:.4f}, rounded down to 0.01 so the budget never grows by more than the " \
            "spare: {:.2f}".format(u, gib(found.spare_bytes), gib(total), u + found.spare_bytes / total, new)
        move = "({:.2f} − {:g}) × {} = {} more budget, and as much more KV cache, per worker".format(
            new, u, gib(total), gib(gain))
    else:
        spare = "{} ({}) is below the {} margin by {}".format(free, h.how, gib(margin), gib(-found.spare_bytes))
        step = "u {:g} − {} ÷ T {} ≈ {:.4f}, rounded down to 0.01 so at least the shortfall is given back: " \
            "{:.2f}".format(u, gib(-found.spare_bytes), gib(total), u + found.spare_bytes / total, new)
        move = "({:g} − {:.2f}) × {} = {} less budget, and as much less KV cache, per worker".format(
            u, new, gib(total), gib(-gain))
    cap = a.kv_capacity()
    tokens = a.kv_tokens_for(gain)
    per = " = {:+,} KV tokens ({}: {:,} tokens per GiB)".format(
        tokens, cap[2], cap[0] * (1 << 30) // cap[1]) if cap and tokens is not None else \
        " (KV tokens unknown: the log gives no KV cache size to scale)"
    return "{}; {} ({}); {}{}.".format(spare, step, got[1], move, per)


def _slots(a: Analysis) -> Optional[int]:
    """--max-num-seqs where the server's arguments say it (vLLM prints no slot count of its own)."""
    value = a.server_args.get("max_num_seqs")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


RECOMMENDERS = [on_failure, resize_utilization]
