"""A TensorRT-LLM startup in the JSON report: the shared keys plus its era, KV passes and per-rank figures."""

from __future__ import annotations

from typing import Any, Dict

from kvforensics.reports.json_report import finding_dict, recommendation_dict, redact, verdict_dict

# The figures of a rank, in bytes or counts (null when the log does not say), each with its source line.
RANK_FIELDS = ("weights_bytes", "kv_cache_bytes", "kv_tokens", "tokens_per_block", "primary_blocks",
               "secondary_blocks", "max_blocks_per_seq", "available_kv_bytes", "total_gpu_bytes",
               "free_gpu_memory_fraction", "peak_bytes", "estimated_kv_bytes", "temporary_kv_bytes",
               "torch_limit_bytes", "engine_size_bytes", "execution_context_bytes", "max_seq_len", "max_num_tokens",
               "max_batch_size", "kv_bytes_per_token", "free_before_failure_bytes", "available_bytes",
               "activation_bytes", "non_torch_bytes", "trt_managed_bytes", "max_num_requests",
               "max_attention_window", "max_beam_width", "weights_outside_torch_bytes", "torch_fraction")


def _rank(r: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {"rank": r.rank}
    out.update({key: getattr(r, key) for key in RANK_FIELDS})
    out["sources"] = dict(r.sources)
    return out


def target_dict(a: Any) -> Dict[str, Any]:
    """A TensorRT-LLM analysis (agent/trtllm/analysis.py): the shared keys plus its startup figures."""
    f = a.failed
    return {
        "target": a.target,
        "status": a.status,
        "problems": [{"code": p.code, "message": p.message} for p in a.problems],
        "engine": {"name": "trtllm", "version_hint": a.era.hint, "version_clues": list(a.era.clues),
                   "server_args": redact(a.server_args), "era": a.era.name, "backend": a.era.backend,
                   "version": a.era.version},
        "startup": {
            "index": a.startup_index,
            "count": a.startup_count,
            "first_line": a.startup_first_line,
            "failure": None if f is None else {
                "cause": f.cause, "message": f.message, "stage": f.stage, "rank": f.rank, "line": f.line,
                "offset": f.offset, "component": f.component,
                "stages": [{"stage": s, "free_before_bytes": b, "free_after_bytes": after}
                           for s, b, after in f.stage_table]},
            "complete": a.complete,
            "stages": list(a.stages_seen),
            "rank_count": a.rank_count,
            "kv_cache_tokens": a.kv_cache_tokens,
            "kv_passes": [p.to_json() for p in a.passes],
            "kv_checks": [{"rank": c.rank, "formula": c.formula, "predicted_bytes": c.predicted_bytes,
                           "logged_bytes": c.logged_bytes, "agrees": c.agrees} for c in a.checks],
            "ranks": [_rank(r) for r in a.ranks],
        },
        "findings": [finding_dict(x) for x in a.findings],
        "recommendations": [recommendation_dict(r) for r in a.recommendations],
        "verdict": verdict_dict(getattr(a, "verdict", None)),
    }
