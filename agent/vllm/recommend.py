"""vLLM recommendations: exact flags, only where the log gives the numbers (estimated from a log)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator

from agent.model.node_rules import live_settings, spare_memory
from agent.model.records import Recommendation
from agent.vllm.analysis import Analysis
from collectors.units import gib

if TYPE_CHECKING:
    from agent.model.context import Context


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
                             "does not.".format(f.where, d["fits_tokens"], d["max_model_len"]))
        if str(a.kv_cache_dtype).lower() in ("bfloat16", "float16", "half", "bf16", "fp16"):
            yield Recommendation(flag="--kv-cache-dtype", value="fp8", gain_bytes=None, gain_tokens=None,
                                 basis="estimated",
                                 rationale="An 8-bit KV cache holds about twice the tokens of a 16-bit one in the same "
                                 "memory (quality cost is model-dependent).")
    elif f.cause == "insufficient_free_memory" and d.get("total_bytes"):
        u = math.floor(d["free_bytes"] / d["total_bytes"] * 100) / 100
        yield Recommendation(flag="--gpu-memory-utilization", value="{:.2f}".format(u), gain_bytes=None,
                             gain_tokens=None, basis="estimated",
                             rationale="Free {} of {} at worker start ({}): the largest budget that passes the check "
                             "is free / total; or free the memory other processes hold.".format(
                                 gib(d["free_bytes"]), gib(d["total_bytes"]), f.where))
    elif f.cause == "cuda_out_of_memory" and f.stage == "graph_capture" and a.era.graphs_inside is False:
        yield Recommendation(flag="--enforce-eager", value="", gain_bytes=None, gain_tokens=None, basis="estimated",
                             rationale="The OOM came during CUDA graph capture, which in this era sits outside the "
                             "budget; eager mode needs no graph memory (or lower --gpu-memory-utilization by the "
                             "graph size).")


def resize_utilization(ctx: "Context") -> Iterator[Recommendation]:
    """Memory no budget covers, beyond the margin, into the budget (measured on a live node: NVML, or
    the run's low-water mark; else estimated from the startup's figures); or, below the margin, the
    budget lowered by the shortfall so runtime growth (NCCL, allocator fragments) has room."""
    a = ctx.analysis
    if not isinstance(a, Analysis) or a.failed is not None:
        return
    found = spare_memory(ctx)
    if found is None or (not found.worth_it and found.spare_bytes >= 0):
        return
    h = found.headroom
    g = h.gpu
    cuda_total = g.total_bytes - g.reserved_bytes if g and g.total_bytes and g.reserved_bytes is not None else None
    moved = a.utilization_for(found.spare_bytes, cuda_total, live_settings(ctx.live) if ctx.live else None)
    if moved is None or (moved[1] > 0) != (found.spare_bytes > 0):
        return
    new, gain = moved
    cell = a.budget.cell_bytes
    basis = "measured" if h.measured else "estimated"
    free = gib(h.free_bytes) + (" free" if ctx.live is not None else " outside the budget after startup")
    if gain > 0:
        why = "{} ({}), minus the {} margin: the budget, and with it the KV cache, can grow by {} per worker.".format(
            free, h.how, gib(a.options.margin_bytes), gib(gain))
    else:
        why = ("{} ({}) is below the {} margin: lowering the budget by {} per worker gives it back (the KV cache "
               "shrinks by as much).").format(free, h.how, gib(a.options.margin_bytes), gib(-gain))
    yield Recommendation(flag="--gpu-memory-utilization", value="{:.2f}".format(new), gain_bytes=gain,
                         gain_tokens=gain // cell if cell else None, basis=basis, rationale=why)


RECOMMENDERS = [on_failure, resize_utilization]
