"""TensorRT-LLM's log rules: small pure functions over its Analysis, each yielding Findings. The rules every
engine shares are in ``agent/model/node_rules.py``; ``agent/model/rulebook.py`` runs them all."""

from __future__ import annotations

from typing import Iterator, Optional

from kvforensics.agent.model import fragment
from kvforensics.agent.model.citing import and_list, where
from kvforensics.agent.model.records import Finding
from kvforensics.agent.trtllm.analysis import STAGE_WORDS, STAGES, Analysis, Failure, Rank
from kvforensics.collectors.units import gib

_CAUSE_WORDS = {
    "executor_insufficient_memory": "the executor could not be created: GPU memory ran out",
    "max_tokens_too_small": "the KV cache cannot hold one sequence of max_seq_len",
    "cuda_out_of_memory": "a CUDA allocation ran out of memory",
    "exception": "an exception ended it",
}


def _component_action(component: Optional[str]) -> str:
    """What to change for the part that could not be created (the executor memory monitor names it)."""
    words = (component or "").lower()
    if "kv" in words or "cache" in words:
        return ("lower kv_cache_config.free_gpu_memory_fraction (or set max_tokens) so the KV cache leaves room for "
                "what is created after it")
    if "model" in words or "weight" in words or "engine" in words:
        return "the model does not fit: more GPUs (--tp_size) or a smaller quantization"
    return "lower --max_num_tokens or --max_batch_size (the warm-up and CUDA graphs), or free_gpu_memory_fraction"


def startup_failed(a: Analysis) -> Iterator[Finding]:
    f = a.failed
    if f is None:
        return
    explain = _CAUSE_WORDS.get(f.cause, f.cause)
    stage = STAGE_WORDS.get(f.stage, f.stage)
    detail = "{}: {} ({}{}). Stage: {}.".format(explain, f.message, f.rank + " " if f.rank else "", f.where, stage)
    action = ""
    if f.cause == "executor_insufficient_memory":
        detail += _executor_table(f)
        action = _component_action(f.component)
    elif f.cause == "max_tokens_too_small":
        detail += _too_few(f)
        action = ("raise free_gpu_memory_fraction or max_tokens, or lower max_seq_len / the beam width so one "
                  "sequence fits")
    yield Finding(code="startup_failed", severity="critical",
                  title="The startup failed during {}: {}".format(stage, explain), detail=detail, bytes=None,
                  evidence=(f.where,), proof="{}{}: {}".format(f.rank + " " if f.rank else "", f.where, f.message),
                  action=action)


def _executor_table(f: Failure) -> str:
    parts = []
    if f.component:
        parts.append(" Not created: {}.".format(f.component))
    for label, value in f.totals:
        parts.append(" {}: {}.".format(label[:1].upper() + label[1:], gib(value)))
    if f.stage_table:
        rows = ", ".join("{} {} → {}".format(label, gib(b), gib(after)) for label, b, after in f.stage_table)
        parts.append(" Free memory before → after each stage created: {}.".format(rows))
    return "".join(parts)


def _too_few(f: Failure) -> str:
    d = f.data
    parts = [d.get(k) for k in ("beam_width", "tokens_per_block", "max_blocks_per_seq")]
    if d.get("max_tokens") is None or any(p is None for p in parts):
        return " The log does not print the figures (this release's message has none)."
    need = parts[0] * parts[1] * parts[2]
    return (" The KV cache holds {:,} tokens; one sequence needs beam {} × {} tokens per block × {} blocks = {:,}."
            .format(d["max_tokens"], parts[0], parts[1], parts[2], need))


def incomplete_startup(a: Analysis) -> Iterator[Finding]:
    if a.complete or a.failed is not None:
        return
    yield fragment.incomplete_startup(
        STAGES, STAGE_WORDS, a.stages_seen, a.last_event, "the server was ready",
        detail="TensorRT-LLM's startup continues after this (the KV cache, the warm-up and CUDA graphs, the "
        "server) and may still fail, so this report makes no unused-memory verdict and recommends no "
        "fraction raise. To settle it, include the startup up to 'Application startup complete' "
        "(trtllm-serve) or 'Started HTTPService' (Triton).",
        action="paste the startup up to 'Application startup complete' or 'Started HTTPService', or run "
        "`kvforensics inspect` on the node")


def fraction_semantics(a: Analysis) -> Iterator[Finding]:
    """Why the KV cache is its size: what free_gpu_memory_fraction is a share of in this log's era, with its figures."""
    kv = a.binding()
    final = a.final_pass()
    if kv is None or final is None or final.kv_cache_bytes is None:
        return
    sized = a.sizing()
    tokens = " ({:,} tokens)".format(final.kv_tokens) if final.kv_tokens else ""
    if sized is None:
        detail = ("TensorRT-LLM's KV cache is free_gpu_memory_fraction × the memory free when it is sized, after the "
                  "engine (C++) or the profiled peak (PyTorch); this log prints neither that memory nor the fraction, "
                  "so the share cannot be checked. The KV cache: {}{} ({}).".format(
                      gib(final.kv_cache_bytes), tokens, where(final.event)))
        yield Finding(code="kv_fraction_semantics", severity="info",
                      title="The KV cache is {}{}".format(gib(final.kv_cache_bytes), tokens), detail=detail,
                      bytes=final.kv_cache_bytes, evidence=(where(final.event),),
                      proof="KV cache {}{} ({})".format(gib(final.kv_cache_bytes), tokens, where(final.event)))
        return
    base, f, how, r = sized
    yield Finding(code="kv_fraction_semantics", severity="info", title=_title(how, f),
                  detail=_detail(a, how, base, f, r, final.kv_cache_bytes, tokens), bytes=final.kv_cache_bytes,
                  evidence=tuple(s for s in (r.sources.get("peak_bytes") or r.sources.get("available_bytes"),
                                             where(final.event)) if s),
                  proof=_proof(how, base, f, r, final.kv_cache_bytes, tokens),
                  mechanism=_mechanism(a, how, base, f, r, final.kv_cache_bytes, tokens))


def _title(how: str, f: float) -> str:
    if how == "pytorch":
        return "free_gpu_memory_fraction {:.2f} is a share of total − the profiled peak, not of the GPU".format(f)
    return "free_gpu_memory_fraction {:.2f} is a share of the memory free after the engine loaded".format(f)


def _detail(a: Analysis, how: str, base: int, f: float, r: Rank, kv: int, tokens: str) -> str:
    if how == "pytorch":
        return ("In the PyTorch backend TensorRT-LLM runs the model once with a temporary KV pool, then gives the "
                "KV cache F × (device total − peak during that run + the temporary pool) "
                "(tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator). Here: {:.2f} × ({} − {} + {} = {}) = {}; "
                "the KV cache got {}{}. The peak counts weights, activations for max_num_tokens and memory outside "
                "torch (NCCL, CUDA graphs, and other processes on the GPU).".format(
                    f, gib(r.total_gpu_bytes), gib(r.peak_bytes), gib(r.temporary_kv_bytes or 0), gib(base),
                    gib(int(f * base)), gib(kv), tokens))
    return ("TensorRT-LLM's C++ KV manager gives the KV cache F × the memory available when it is sized (free + the "
            "runtime pool's free bytes), after the engine, its execution context and the runtime buffers "
            "(batch_manager/kvCacheManager.cpp calculateMaxNumBlocks); every rank takes the smallest count. Here: "
            "{:.2f} × {} = {}; the KV cache got {}{}.".format(f, gib(base), gib(int(f * base)), gib(kv), tokens))


def _proof(how: str, base: int, f: float, r: Rank, kv: int, tokens: str) -> str:
    if how == "pytorch":
        return "{:.2f} × (total {} − peak {} + temporary pool {}) ≈ {} ({}); KV cache {}{}".format(
            f, gib(r.total_gpu_bytes), gib(r.peak_bytes), gib(r.temporary_kv_bytes or 0), gib(int(f * base)),
            r.sources.get("peak_bytes", ""), gib(kv), tokens)
    return "{:.2f} × available {} ({}) ≈ {}; KV cache {}{}".format(
        f, gib(base), r.sources.get("available_bytes", ""), gib(int(f * base)), gib(kv), tokens)


def _mechanism(a: Analysis, how: str, base: int, f: float, r: Rank, kv: int, tokens: str) -> str:
    if how == "pytorch":
        return ("The KV cache is {:.2f} × what the profiling run left of the GPU: total {} − peak {} (weights, "
                "activations, memory outside torch) + the temporary pool {} = {}, so {}{}; the GPU's size alone "
                "does not set it.".format(f, gib(r.total_gpu_bytes), gib(r.peak_bytes), gib(r.temporary_kv_bytes or 0),
                                          gib(base), gib(kv), tokens))
    return ("The KV cache is {:.2f} × the {} free once the engine and its buffers were loaded, so {}{}; what the "
            "engine holds comes off before the fraction applies.".format(f, gib(base), gib(kv), tokens))


def window_reduced(a: Analysis) -> Iterator[Finding]:
    """The final pool holds fewer tokens than the model's attention window: TensorRT-LLM cut the window (and
    max_seq_len) to what fits, so requests longer than that are refused or truncated."""
    cut = a.window_cut
    if cut is None or a.failed is not None:
        return
    d = cut.data
    yield Finding(code="attention_window_reduced", severity="warning",
                  title="The served context shrank: the attention window was cut {}to {:,} tokens, what the KV cache "
                  "holds".format("from {:,} ".format(d["window"]) if d["window"] else "", d["reduced_to"]),
                  detail="TensorRT-LLM caps the attention window (and max_seq_len) at what the KV pool holds "
                  "(blocks × tokens per block ÷ beam width) when the pool is smaller than one sequence of the "
                  "configured length ({}). A longer request cannot be served whole. A larger pool (a higher "
                  "free_gpu_memory_fraction where memory is left, an FP8 KV cache, a smaller max_num_tokens or "
                  "max_batch_size, more GPUs) brings the window back; so does a max_seq_len you actually need.".format(
                      where(cut)),
                  bytes=None, evidence=(where(cut),),
                  proof="'{}' ({})".format(cut.text[:120], where(cut)))


def kv_budget_check(a: Analysis) -> Iterator[Finding]:
    """One finding for the ranks that match the era's formula, one per rank that does not."""
    agree = [c for c in a.checks if c.agrees]
    if agree:
        c = agree[0]
        ranks = and_list(x.rank for x in agree if x.rank)
        yield Finding(code="kv_budget_check", severity="info",
                      title="The KV budget matches TensorRT-LLM's formula{}".format(" on " + ranks if ranks else ""),
                      detail="{}: predicted {}, logged {} (within {}).".format(
                          c.formula, gib(c.predicted_bytes), gib(c.logged_bytes), gib(c.tolerance_bytes)),
                      bytes=c.logged_bytes, evidence=tuple(e for x in agree for e in x.evidence))
    for c in a.checks:
        if c.agrees is False:
            yield Finding(code="kv_budget_check", severity="warning",
                          title="The KV budget differs from TensorRT-LLM's formula by {}".format(
                              gib(abs((c.predicted_bytes or 0) - (c.logged_bytes or 0)))),
                          detail="{}: predicted {}, logged {}. A release whose sizing differs from the one this "
                          "formula comes from, a max_tokens or max_gpu_total_bytes cap, or another rank's smaller "
                          "free memory (every rank takes the minimum).".format(
                              c.formula, gib(c.predicted_bytes), gib(c.logged_bytes)),
                          bytes=c.logged_bytes, evidence=c.evidence)


def user_cap(a: Analysis) -> Iterator[Finding]:
    cap = a.user_cap
    final = a.final_pass()
    if cap is None or final is None:
        return
    yield Finding(code="kv_capped_by_max_tokens", severity="info",
                  title="max_tokens caps the KV cache at {:,} tokens".format(cap.data.get("max_tokens") or 0),
                  detail="Both free_gpu_memory_fraction and max_tokens are set: TensorRT-LLM uses the smaller ({}), "
                  "so the fraction does not size the pool; the KV cache got {} ({}).".format(
                      where(cap), gib(final.kv_cache_bytes), where(final.event)),
                  bytes=final.kv_cache_bytes, evidence=(where(cap), where(final.event)))


HEADLINES = [startup_failed, incomplete_startup]
RULES = [fraction_semantics, user_cap, window_reduced, kv_budget_check]
