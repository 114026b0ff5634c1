"""A vLLM startup in the JSON report: the shared keys plus its era, KV figures and per-worker ledger."""

from __future__ import annotations

from typing import Any, Dict

from kvforensics.reports.json_report import finding_dict, recommendation_dict, redact, verdict_dict


def _worker(w: Any) -> Dict[str, Any]:
    return {"rank": w.rank, "weights_bytes": w.weights_bytes, "total_gpu_bytes": w.total_gpu_bytes,
            "gpu_memory_utilization": w.gpu_memory_utilization, "requested_bytes": w.requested_bytes,
            "non_torch_bytes": w.non_torch_bytes, "activation_peak_bytes": w.activation_peak_bytes,
            "cuda_graph_bytes": w.cuda_graph_bytes, "cuda_graph_estimate_bytes": w.cuda_graph_estimate_bytes,
            "available_kv_bytes": w.available_kv_bytes, "kv_allocated_bytes": w.kv_allocated_bytes,
            "free_at_start_bytes": w.free_at_start_bytes, "initial_usage_bytes": w.initial_usage_bytes,
            "peak_torch_bytes": w.peak_torch_bytes, "post_profile_usage_bytes": w.post_profile_usage_bytes,
            "sources": dict(w.sources)}


def target_dict(a: Any) -> Dict[str, Any]:
    """A vLLM analysis (agent/vllm/analysis.py): the shared keys plus vLLM's startup figures."""
    failure = a.failed
    return {
        "target": a.target,
        "status": a.status,
        "problems": [{"code": p.code, "message": p.message} for p in a.problems],
        "engine": {"name": "vllm", "version_hint": a.era.hint, "version_clues": list(a.era.clues),
                   "server_args": redact(a.server_args), "era": a.era.name,
                   "cuda_graphs_in_budget": a.era.graphs_inside},
        "startup": {
            "index": a.startup_index,
            "count": a.startup_count,
            "first_line": a.startup_first_line,
            "failure": None if failure is None else {
                "cause": failure.cause, "message": failure.message, "stage": failure.stage,
                "rank": failure.rank, "line": failure.line, "offset": failure.offset},
            "complete": a.complete,
            "stages": list(a.stages_seen),
            "kv_cache_tokens": a.kv_cache_tokens,
            "kv_cache_reports": list(a.kv_cache_reports),
            "gpu_blocks": a.gpu_blocks,
            "cpu_blocks": a.cpu_blocks,
            "max_model_len": a.max_model_len,
            "kv_cache_dtype": a.kv_cache_dtype,
            "max_concurrency": None if not a.max_concurrency else {
                "tokens_per_request": a.max_concurrency.get("tokens_per_request"),
                "times": a.max_concurrency.get("times")},
            "kv_checks": [{"rank": c.rank, "formula": c.formula, "predicted_bytes": c.predicted_bytes,
                           "logged_bytes": c.logged_bytes, "agrees": c.agrees} for c in a.checks],
            "kv_geometry": None if a.geometry is None else {
                "kind": a.geometry.kind, "layers": a.geometry.layers, "bytes_per_token": a.geometry.bytes_per_token,
                "dtype": a.geometry.dtype, "formula": a.geometry.formula},
            "ranks": [_worker(w) for w in a.ranks],
        },
        "findings": [finding_dict(f) for f in a.findings],
        "recommendations": [recommendation_dict(r) for r in a.recommendations],
        "verdict": verdict_dict(getattr(a, "verdict", None)),
    }
