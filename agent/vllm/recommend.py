"""vLLM recommendations: exact flags, only where the log gives the numbers (estimated from a log)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator

from agent.node_rules import UNUSED_WARN_BYTES
from agent.records import Recommendation
from agent.vllm.analysis import Analysis
from collectors.units import gib

if TYPE_CHECKING:
    from agent.rulebook import Context


def on_failure(ctx: "Context") -> Iterator[Recommendation]:
    a = ctx.analysis
    if not isinstance(a, Analysis) or a.failed is None:
        return
    f = a.failed
    d = f.data
    if f.cause == "max_model_len_too_large" and d.get("fits_tokens"):
        yield Recommendation("--max-model-len", str(d["fits_tokens"]), None, None, "estimated",
                             "vLLM's own figure ({}): {:,} tokens fit in the KV cache, max_model_len {:,} does not."
                             .format(f.where, d["fits_tokens"], d["max_model_len"]))
        if str(a.kv_cache_dtype).lower() in ("bfloat16", "float16", "half", "bf16", "fp16"):
            yield Recommendation("--kv-cache-dtype", "fp8", None, None, "estimated",
                                 "An 8-bit KV cache holds about twice the tokens of a 16-bit one in the same memory "
                                 "(quality cost is model-dependent).")
    elif f.cause == "insufficient_free_memory" and d.get("total_bytes"):
        u = math.floor(d["free_bytes"] / d["total_bytes"] * 100) / 100
        yield Recommendation("--gpu-memory-utilization", "{:.2f}".format(u), None, None, "estimated",
                             "Free {} of {} at worker start ({}): the largest budget that passes the check is "
                             "free / total; or free the memory other processes hold.".format(
                                 gib(d["free_bytes"]), gib(d["total_bytes"]), f.where))
    elif f.cause == "cuda_out_of_memory" and f.stage == "graph_capture" and a.era.graphs_inside is False:
        yield Recommendation("--enforce-eager", "", None, None, "estimated",
                             "The OOM came during CUDA graph capture, which in this era sits outside the budget; "
                             "eager mode needs no graph memory (or lower --gpu-memory-utilization by the graph size).")


def raise_utilization(ctx: "Context") -> Iterator[Recommendation]:
    a = ctx.analysis
    if not isinstance(a, Analysis) or a.failed is not None or ctx.live is not None:
        return
    free, src = a.headroom()
    w = next((x for x in a.ranks if x.total_gpu_bytes and x.gpu_memory_utilization is not None), None)
    if free is None or w is None:
        return
    spare = free - a.options.margin_bytes
    if spare < UNUSED_WARN_BYTES:
        return
    assert w.total_gpu_bytes is not None and w.gpu_memory_utilization is not None
    new = math.floor((w.gpu_memory_utilization + spare / w.total_gpu_bytes) * 100) / 100
    gain = int((new - w.gpu_memory_utilization) * w.total_gpu_bytes)
    if gain <= 0:
        return
    cell = a.budget.cell_bytes
    yield Recommendation("--gpu-memory-utilization", "{:.2f}".format(new), gain, gain // cell if cell else None,
                         "estimated", "{} outside the budget after startup ({}), minus the {} margin: the budget can "
                         "grow by {}.".format(gib(free), src, gib(a.options.margin_bytes), gib(gain)))


RECOMMENDERS = [on_failure, raise_utilization]
