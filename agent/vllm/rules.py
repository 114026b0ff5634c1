"""vLLM's log rules: small pure functions over a vLLM Analysis, each yielding Findings. The rules
every engine shares are in ``agent/model/node_rules.py``; ``agent/model/rulebook.py`` runs them all."""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

from kvforensics.agent.model import fragment
from kvforensics.agent.model.citing import and_list, where
from kvforensics.agent.model.records import Finding
from kvforensics.agent.vllm.analysis import STAGE_WORDS, STAGES, Analysis, Worker
from kvforensics.collectors.units import gib

SHARED_GPU_BYTES = 1 << 30  # used memory at worker start beyond this is more than a CUDA context and NCCL

_CAUSE_WORDS = {
    "insufficient_free_memory": "free GPU memory at worker start was below total × gpu_memory_utilization",
    "max_model_len_too_large": "one request of max_model_len does not fit in the KV cache",
    # 0.20+ (v1/worker/gpu_worker.py determine_available_memory) also takes the CUDA-graph estimate off the
    # budget before the KV cache: a huge estimate alone can leave nothing (vllm#53013, corpus entry 41)
    "no_kv_memory": "weights, activations, non-torch memory and, from 0.20, the CUDA-graph estimate took the whole "
                    "budget (nothing for the KV cache)",
    "memory_freed_during_profiling": "another process freed GPU memory while vLLM profiled",
    "cuda_out_of_memory": "a CUDA allocation ran out of memory",
    "engine_failed": "the engine core failed to start",
    "worker_died": "a worker process died",
    "exception": "an exception ended it",
}


def startup_failed(a: Analysis) -> Iterator[Finding]:
    f = a.failed
    if f is None:
        return
    explain = _CAUSE_WORDS.get(f.cause, f.cause)
    stage = STAGE_WORDS.get(f.stage, f.stage)
    detail = "{}: {} ({}{}). Stage: {} (from {}).".format(explain, f.message, f.rank + " " if f.rank else "", f.where,
                                                          stage, f.stage_source)
    d = f.data
    if f.cause == "max_model_len_too_large" and d.get("fits_tokens"):
        detail += " max_model_len {:,}; what fits: {:,} tokens.".format(d["max_model_len"], d["fits_tokens"])
    if f.cause == "insufficient_free_memory":
        detail += " Free {} of {}; the budget asked {} (u = {:g}).".format(
            gib(d["free_bytes"]), gib(d["total_bytes"]), gib(d["requested_bytes"]), d["utilization"])
    yield Finding(code="startup_failed", severity="critical",
                  title="The startup failed during {}: {}".format(stage, explain), detail=detail, bytes=None,
                  evidence=(f.where,), proof=_failure_proof(a))


def _failure_proof(a: Analysis) -> str:
    """The failure's own words, verbatim, where they are; then the KV figure it followed, when there is one."""
    f = a.failed
    assert f is not None
    proof = "{}{}: {}".format(f.rank + " " if f.rank else "", f.where, f.message)
    w = a.binding()
    if f.cause == "no_kv_memory" and w is not None and w.available_kv_bytes is not None:
        proof += "; KV cache memory before it {} ({})".format(gib(w.available_kv_bytes),
                                                             w.sources.get("available_kv_bytes", ""))
    return proof


def incomplete_startup(a: Analysis) -> Iterator[Finding]:
    if a.complete or a.failed is not None:
        return
    yield fragment.incomplete_startup(
        STAGES, STAGE_WORDS, a.stages_seen, a.last_event, "the startup finished",
        detail="vLLM's startup continues after this (KV cache allocation, CUDA graph capture, engine ready) "
        "and may still fail, so this report makes no unused-memory verdict and recommends no "
        "--gpu-memory-utilization raise. To settle it, include the startup up to 'init engine … took' or "
        "the API server's ready line.",
        action="paste the startup up to 'init engine … took' or the API server's ready line, or run "
        "`kvforensics inspect` on the node")


def gpu_memory_utilization_semantics(a: Analysis) -> Iterator[Finding]:
    if any(e.data.get("explicit_kv") for e in a.events if e.data):
        # --kv-cache-memory(-bytes) given: vLLM skips profiling and ignores T·u (gpu_worker.py
        # determine_available_memory, 0.10.2+ "This does not respect the gpu_memory_utilization config")
        return
    w = next((x for x in a.ranks if x.gpu_memory_utilization is not None or x.available_kv_bytes is not None), None)
    if w is None:
        return
    u = w.gpu_memory_utilization
    era = a.era
    what = {
        "V0-a": "KV = T·u − (free at init − free after the profile run)",
        "V0-b": "KV = T·u − torch peak − all non-torch memory on the device (other processes included)",
        "V1-a": "KV = T·u − torch peak − all non-torch memory on the device (other processes included)",
        "V1-e": "KV = ceil(T·u) − (weights + activation peak + non-torch) − the CUDA graph estimate",
        "V1-f": "KV = ceil(T·u) − memory consumed since init − transient peak − the CUDA graph estimate",
    }.get(era.name or "", "KV = T·u − (weights + activation peak + non-torch growth since init)")
    detail = ("--gpu-memory-utilization{} is a fraction of the whole device (T, cudaMemGetInfo total), not of free "
              "memory: vLLM's budget is T·u and, in this log's era ({}), {}.").format(
        " {:g}".format(u) if u is not None else "", era.hint or "not pinned", what)
    if w.total_gpu_bytes is not None and w.requested_bytes is not None:
        detail += " Here: {} × {:g} = {} ({}).".format(gib(w.total_gpu_bytes), u or 0, gib(w.requested_bytes),
                                                       w.sources.get("requested_bytes", ""))
    if a.graphs_outside_budget():
        detail += " CUDA graphs are captured outside it, on top."
    if w.available_kv_bytes is not None:
        detail += " KV cache memory on {}: {}.".format(w.rank or "the worker", gib(w.available_kv_bytes))
    yield Finding(code="gpu_memory_utilization_semantics", severity="info",
                  title=_budget_title(a, w), detail=detail, bytes=w.requested_bytes,
                  evidence=tuple(s for s in (w.sources.get("requested_bytes"), w.sources.get("available_kv_bytes"))
                                 if s), proof=_budget_proof(w), mechanism=budget_mechanism(a, w))


def _utilization(a: Analysis, w: Worker) -> Optional[Tuple[float, str]]:
    """u and, when it is not the worker's own figure, where it comes from (the arguments, the era's default)."""
    if w.gpu_memory_utilization is not None:
        return w.gpu_memory_utilization, ""
    got = a.fraction({})
    if got is None:
        return None
    return got[0], " (the default)" if "default" in got[1] else ""


def _budget_title(a: Analysis, w: Worker) -> str:
    u = _utilization(a, w)
    if u is not None and w.total_gpu_bytes is not None and w.available_kv_bytes is not None:
        return "--gpu-memory-utilization {:g} × the GPU's {} = {} budget; {} of it for the KV cache".format(
            u[0], gib(w.total_gpu_bytes), gib(int(w.total_gpu_bytes * u[0])), gib(w.available_kv_bytes))
    return "gpu_memory_utilization is a fraction of the GPU's total memory"


# What comes out of T·u before the KV cache, by era (the terms each release prints), in the order vLLM
# subtracts them: (label, worker field).
_OUT_OF_BUDGET = (("the weights", "weights_bytes"), ("the activation peak", "activation_peak_bytes"),
                  ("non-torch memory", "non_torch_bytes"), ("the CUDA-graph estimate", "cuda_graph_estimate_bytes"))


def budget_mechanism(a: Analysis, w: Worker) -> str:
    """Why the KV cache is its size, in vLLM's own arithmetic: the budget T·u (a share of the whole GPU, not
    of free memory), what came out of it with the figures this log prints, and what was left for the KV
    cache; graphs on top where the era captures them outside the budget. '' without u or the KV figure."""
    u = _utilization(a, w)
    kv = w.available_kv_bytes
    if u is None or kv is None:
        return ""
    if w.total_gpu_bytes is not None:
        budget = int(w.total_gpu_bytes * u[0])
        head = "vLLM's budget is --gpu-memory-utilization {:g}{} × the GPU's whole {} = {}, not a share of free " \
            "memory".format(u[0], u[1], gib(w.total_gpu_bytes), gib(budget))
    else:
        budget = None
        head = "vLLM's budget is --gpu-memory-utilization {:g}{} × the GPU's whole memory (this release does not " \
            "print the total)".format(u[0], u[1])
    inside = not a.graphs_outside_budget()
    parts = [(label, getattr(w, name)) for label, name in _OUT_OF_BUDGET
             if getattr(w, name) and (name != "cuda_graph_estimate_bytes" or inside)]
    if w.peak_torch_bytes and not w.weights_bytes:  # 0.6.4.x: the torch peak, weights included
        parts.insert(0, ("the torch peak (weights included)", w.peak_torch_bytes))
    said = sum(n for _, n in parts)
    items = ["{} ({})".format(label, gib(n)) for label, n in parts]
    if budget is not None and budget - said - kv > NOT_ITEMISED_BYTES:
        items.append("{} not itemised in this log".format(gib(budget - said - kv)))
    elif budget is None or not parts:
        items.append("what this log does not itemise")
    text = "{}; out of it came {}, leaving {} for the KV cache.".format(head, and_list(items), gib(kv))
    if not inside:
        graphs = max((x.cuda_graph_bytes or 0 for x in a.ranks), default=0)
        text += " CUDA graphs{} are captured on top of the budget.".format(
            " ({})".format(gib(graphs)) if graphs else "")
    return text


NOT_ITEMISED_BYTES = 1 << 28  # 0.25 GiB: the log's rounding of four figures stays below it



def _budget_proof(w: Worker) -> str:
    """The budget as the whole GPU's share, what of it the KV cache got, and what lies outside it; without the
    total, the figures the log does print, with their lines."""
    parts = []
    if w.total_gpu_bytes is not None and w.requested_bytes is not None and w.gpu_memory_utilization is not None:
        parts.append("T·u = {} × {:g} = {} budget, a share of the whole GPU".format(
            gib(w.total_gpu_bytes), w.gpu_memory_utilization, gib(w.requested_bytes)))
    if w.available_kv_bytes is not None and parts:
        parts.append("{} of it for KV".format(gib(w.available_kv_bytes)))
    elif w.available_kv_bytes is not None:
        parts += ["{} {} ({})".format(label, gib(getattr(w, name)), w.sources.get(name, "the log"))
                  for label, name in (("weights", "weights_bytes"), ("KV cache", "available_kv_bytes"))
                  if getattr(w, name) is not None]
        parts.append("the GPU's total is not in this log")
    if w.total_gpu_bytes is not None and w.requested_bytes is not None:
        parts.append("{} outside it".format(gib(w.total_gpu_bytes - w.requested_bytes)))
    return "; ".join(parts)


def cudagraph_outside_budget(a: Analysis) -> Iterator[Finding]:
    if not a.graphs_outside_budget():
        return
    unapplied = a.era.graphs_inside is not False  # outside only because the estimate is not applied
    graphs = [e for e in a.events if e.kind in ("graph_begin", "graph_end", "graph_estimate", "graph_pool")
              or (e.kind == "graph_advisory" and not e.data.get("applied"))]
    if not graphs:
        return
    size = max((w.cuda_graph_bytes or w.cuda_graph_estimate_bytes or 0 for w in a.ranks), default=0) or None
    why = ("the graph estimate is not taken off the budget here (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0, or "
           "Model Runner V2 before 0.29), so vLLM" if unapplied else "In this era ({}) vLLM".format(
               a.era.hint or "before 0.20.0"))
    detail = ("{} captures CUDA graphs after sizing the KV cache, outside "
              "total × gpu_memory_utilization, so they come on top of the budget{}. A capture OOM at a high "
              "--gpu-memory-utilization is this; --enforce-eager removes the graphs (slower decode). From 0.20.0 "
              "the graph estimate is inside the budget when it is applied.").format(
        why[0].upper() + why[1:], ": {}".format(gib(size)) if size else " (1–3 GiB per GPU, vLLM's own note)")
    yield Finding(code="cudagraph_outside_budget", severity="info",
                  title="CUDA graphs are allocated outside vLLM's memory budget", detail=detail, bytes=size,
                  evidence=(where(graphs[0]),))


def shared_gpu(a: Analysis) -> Iterator[Finding]:
    for w in a.ranks:
        if w.free_at_start_bytes is None or w.total_gpu_bytes is None:
            continue
        used = w.total_gpu_bytes - w.free_at_start_bytes
        if used < SHARED_GPU_BYTES:
            continue
        yield Finding(code="shared_gpu", severity="warning",
                      title="{} of the GPU was already in use when {} started".format(gib(used),
                                                                                      w.rank or "the worker"),
                      detail="Free {} of {} at worker start ({}): something else (another process, a previous "
                      "instance) holds memory on this GPU. vLLM ≥ 0.9.1 refuses to start when free memory is below "
                      "T·u; older releases shrink the KV cache (0.6.4.x, V1 ≤ 0.9.0) or over-commit (V0 ≥ 0.6.5)."
                      .format(gib(w.free_at_start_bytes), gib(w.total_gpu_bytes),
                              w.sources.get("free_at_start_bytes", "")), bytes=used,
                      evidence=(w.sources.get("free_at_start_bytes", ""),))
        return


def kv_budget_check(a: Analysis) -> Iterator[Finding]:
    for c in a.checks:
        if c.agrees is None:
            continue
        sev = "info" if c.agrees else "warning"
        verdict = "agrees with" if c.agrees else "differs from"
        yield Finding(code="kv_budget_check", severity=sev,
                      title="vLLM's KV budget formula {} the logged KV memory{}".format(
                          verdict, " on " + c.rank if c.rank else ""),
                      detail="{} = {}; logged {} (tolerance {}: every figure is printed to 0.01 GiB).".format(
                          c.formula, gib(c.predicted_bytes), gib(c.logged_bytes), gib(c.tolerance_bytes)),
                      bytes=c.logged_bytes, evidence=c.evidence)
        return
    w = a.binding()
    if a.budget.cell_bytes and w is not None and a.kv_cache_tokens:
        yield Finding(code="kv_budget_check", severity="info",
                      title="The KV cache holds {:,} tokens in {}: ≈ {:,} bytes per token".format(
                          a.kv_cache_tokens, gib(w.available_kv_bytes), a.budget.cell_bytes),
                      detail="Available KV cache memory / GPU KV cache size = {:,} B per token (± print rounding; with "
                      "full attention in every layer: layers × KV heads per rank × head size × 2 × dtype bytes). A "
                      "hybrid model's figure differs.".format(a.budget.cell_bytes), bytes=None,
                      evidence=tuple(s for s in (w.sources.get("available_kv_bytes"),) if s))


def concurrency_bound(a: Analysis) -> Iterator[Finding]:
    c = a.max_concurrency
    if not c or c.get("times") is None or a.failed is not None:
        return
    times, n = c["times"], c["tokens_per_request"]
    sev = "warning" if times < 1 else "info"
    typical = a.options.request_tokens
    at_typical = ""
    if a.kv_cache_tokens and typical and typical != n:
        # tokens ÷ length is vLLM's own arithmetic only where every layer is full attention; a hybrid
        # model's sliding-window or linear-attention layers need less per request (more fit).
        at_typical = (" At {:,} tokens per request (--request-tokens): about {:,} at once (GPU KV cache size ÷ "
                      "request length; at least that many for a hybrid model).").format(
                          typical, a.kv_cache_tokens // typical)
    yield Finding(code="concurrency_bound", severity=sev,
                  title="The KV cache holds {:.2f}× requests of {:,} tokens at once".format(times, n),
                  detail="vLLM's own figure ({}): 'Maximum concurrency for {:,} tokens per request: {:.2f}x'{}. "
                  "{}{}".format(
                      a.concurrency_source, n, times,
                      "; GPU KV cache size {:,} tokens".format(a.kv_cache_tokens) if a.kv_cache_tokens else "",
                      "Not even one full-length request fits." if times < 1 else
                      "More concurrent long requests than that wait for KV blocks (preemption).", at_typical),
                  bytes=None, evidence=(a.concurrency_source,))


GEOMETRY_TOLERANCE = 0.03  # block rounding and the 0.01 GiB print of the KV memory stay well inside


def kv_geometry(a: Analysis) -> Iterator[Finding]:
    """Bytes per token from --model-config (vLLM's paging) against the log's KV memory ÷ its token report."""
    g = a.geometry
    if g is None:
        if a.geometry_note:
            yield Finding(code="kv_geometry", severity="info",
                          title="Bytes per token not computed from the model config", detail=a.geometry_note + ".",
                          bytes=None, evidence=())
        return
    logged = a.logged_bytes_per_token()
    if logged is None:
        yield Finding(code="kv_geometry", severity="info",
                      title="Bytes per token from the model config: {:,} B".format(g.bytes_per_token),
                      detail="{} ({} KV, {}); the log prints no KV memory and token count to compare.".format(
                          g.formula, g.kind.upper(), g.dtype), bytes=None, evidence=())
        return
    per_token, w = logged
    evidence = tuple(x for x in (w.sources.get("available_kv_bytes"), a.summary.source) if x)
    if abs(per_token - g.bytes_per_token) <= GEOMETRY_TOLERANCE * g.bytes_per_token:
        yield Finding(code="kv_geometry", severity="info",
                      title="Bytes per token match the model config: {:,} B".format(g.bytes_per_token),
                      detail="{} = {:,} B ({} KV, {}); the log implies {:,.0f} B (KV memory {} ÷ {:,} tokens).".format(
                          g.formula, g.bytes_per_token, g.kind.upper(), g.dtype, per_token, gib(w.available_kv_bytes),
                          a.kv_cache_tokens), bytes=None, evidence=evidence)
        return
    yield Finding(code="kv_geometry_mismatch", severity="warning",
                  title="The log's KV cache does not match the model config ({:,.0f} B vs {:,} B per token)".format(
                      per_token, g.bytes_per_token),
                  detail="From the config: {} ({}). Check --kv-cache-dtype, the tensor/pipeline parallel sizes, or "
                  "whether the right config.json was given.".format(g.formula, g.dtype), bytes=None, evidence=evidence)


HEADLINES = [startup_failed, incomplete_startup]
RULES = [gpu_memory_utilization_semantics, cudagraph_outside_budget, shared_gpu, kv_budget_check, kv_geometry,
         concurrency_bound]
