"""TensorRT-LLM recommendations: exact settings, only where the log gives the numbers (estimated from a log)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from kvforensics.agent.model.node_rules import gain_requests, spare_memory
from kvforensics.agent.model.records import Recommendation
from kvforensics.agent.trtllm.analysis import Analysis
from kvforensics.collectors.units import gib

if TYPE_CHECKING:
    from kvforensics.agent.model.context import Context


def on_failure(ctx: "Context") -> Iterator[Recommendation]:
    a = ctx.analysis
    if not isinstance(a, Analysis) or a.failed is None:
        return
    f = a.failed
    d = f.data
    if f.cause == "max_tokens_too_small" and d.get("max_tokens") and d.get("tokens_per_block") \
            and d.get("beam_width"):
        fits = d["max_tokens"] // d["beam_width"] // d["tokens_per_block"] * d["tokens_per_block"]
        if fits > 0:
            yield Recommendation(flag="--max_seq_len", value=str(fits), gain_bytes=None, gain_tokens=None,
                                 basis="estimated",
                                 rationale="TensorRT-LLM's own figures ({}): the KV cache holds {:,} tokens, so a "
                                 "sequence of at most {:,} tokens (whole blocks of {}, beam {}) fits; or give the KV "
                                 "cache more memory (free_gpu_memory_fraction, max_tokens).".format(
                                     f.where, d["max_tokens"], fits, d["tokens_per_block"], d["beam_width"]),
                                 fixes="startup_failed")


def resize_fraction(ctx: "Context") -> Iterator[Recommendation]:
    """Memory the pool left free beyond the margin, into the pool: free_gpu_memory_fraction raised to
    (KV + spare) ÷ what it is a share of (``Analysis.kv_change``, the one computation the unused-memory
    finding quotes). No cut from a log alone: a server that reached ready is working as sized."""
    a = ctx.analysis
    if not isinstance(a, Analysis) or a.failed is not None:
        return
    found = spare_memory(ctx)
    if found is None or found.change is None or not (found.worth_it or found.cut_advised):
        return
    change = found.change
    if (change.gain_bytes > 0) != (found.spare_bytes > 0):
        return
    sized = a.sizing()
    assert sized is not None  # kv_change gave a change
    base, f, how, _ = sized
    share = "total − profiled peak + temporary pool" if how == "pytorch" else "the memory available when it was sized"
    h = found.headroom
    rationale = ("{} free when the KV cache was sized ({}) − {} margin = {} {}; F {:.2f} + that ÷ {} ({}) rounded "
                 "down to 0.01: {}; {} {} KV cache per rank = {:+,} tokens.").format(
        gib(h.free_bytes), h.how, gib(a.options.margin_bytes), gib(abs(found.spare_bytes)),
        "spare" if found.spare_bytes > 0 else "short", f, gib(base), share, change.value,
        gib(abs(change.gain_bytes)), "more" if change.gain_bytes > 0 else "less", change.gain_tokens)
    yield Recommendation(flag=change.flag, value=change.value, gain_bytes=change.gain_bytes,
                         gain_tokens=change.gain_tokens, basis="measured" if h.measured else "estimated",
                         rationale=rationale,
                         gain_requests=gain_requests(a.kv_cache_tokens, change.gain_tokens, a.summary.context_len,
                                                     a.options.request_tokens, a.summary.max_running_requests),
                         fixes="unused_gpu_memory" if change.gain_bytes > 0 else "low_headroom")


def fp8_kv_cache(ctx: "Context") -> Iterator[Recommendation]:
    """An 8-bit KV cache, where the log shows the pool binds (the window cut to what it holds, or fewer full-length
    requests fit than the request slots) and the model's config shows the log's bytes per token are 16-bit: the
    same memory then holds twice the tokens. Needs --model-config: the log prints bytes, not the dtype."""
    a = ctx.analysis
    cfg = a.options.model_config if isinstance(a, Analysis) else None
    if not isinstance(a, Analysis) or a.failed is not None or cfg is None or not a.kv_cache_tokens:
        return
    cell = a.budget.cell_bytes
    binds = a.window_cut is not None or (a.summary.context_len and a.summary.max_running_requests and
                                         a.kv_cache_tokens // a.summary.context_len < a.summary.max_running_requests)
    if not cell or not binds:
        return
    from kvforensics.agent.trtllm import kv_geometry

    tp = a.server_args.get("tp_size") if isinstance(a.server_args.get("tp_size"), int) else a.rank_count
    pp = a.server_args.get("pp_size") if isinstance(a.server_args.get("pp_size"), int) else 1
    try:
        sixteen, formula = kv_geometry.bytes_per_token(cfg, 2, tp, pp)
    except kv_geometry.GeometryError:
        return
    if abs(sixteen - cell) > max(64, cell // 100):  # not this model's 16-bit cache (8-bit already, or no match)
        return
    yield Recommendation(
        flag="kv_cache_config.dtype", value="fp8", gain_bytes=None, gain_tokens=a.kv_cache_tokens,
        basis="estimated",
        rationale="The log's {:,} B of KV per token is this model's 16-bit cache ({} = {:,} B, --model-config): an FP8 "
        "cache holds about twice the tokens in the same memory, +{:,} per rank{}. FP8 needs Hopper, Ada or Blackwell "
        "GPUs; its quality cost is the model's (ModelOpt-calibrated scales help).".format(
            cell, formula, sixteen, a.kv_cache_tokens,
            ", and the attention window cut to {:,} tokens comes back".format(a.window_cut.data["reduced_to"])
            if a.window_cut is not None else ""),
        gain_requests=gain_requests(a.kv_cache_tokens, a.kv_cache_tokens, a.summary.context_len,
                                    a.options.request_tokens, a.summary.max_running_requests),
        fixes="attention_window_reduced" if a.window_cut is not None else "concurrency_bound")


RECOMMENDERS = [on_failure, resize_fraction, fp8_kv_cache]
