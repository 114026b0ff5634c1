"""The JSON report, schema ``kvforensics.report/1`` (documented in README, pinned by tests).

Sizes are integer bytes; unknown values are null, never 0. Secrets that SGLang prints in
server_args (API keys, tokens) are replaced by ``"<redacted>"``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Iterable, List, Optional

from agent.live import GpuLedger, Inspection, TargetFailure
from agent.records import Finding, Recommendation, Verdict
from agent.sglang.analysis import Analysis
from agent.sglang.ledger import RankLedger, RunnerLedger
from collectors.redact import redact_mapping
from reports.labels import ITEM_LABELS

SCHEMA = "kvforensics.report/1"
RUNNER_KEYS = ("dist_init_bytes", "pre_load_avail_bytes", "weights_bytes", "post_load_avail_bytes",
               "kv_tokens", "kv_bytes", "bytes_per_token", "pool_end_avail_bytes", "graph_bytes",
               "graph_end_avail_bytes")
EXTRA_RUNNER_KEYS = ("mamba_bytes", "workspace_bytes", "model_type")
def redact(args: Dict[str, Any]) -> Dict[str, Any]:
    return {str(k): _jsonable(v) for k, v in redact_mapping(args).items()}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return repr(value)


def runner_dict(r: RunnerLedger, reserve: Optional[int] = None) -> Dict[str, Any]:
    d: Dict[str, Any] = {k: getattr(r, k) for k in RUNNER_KEYS}
    d["reserve_bytes"] = reserve
    for k in EXTRA_RUNNER_KEYS:
        d[k] = getattr(r, k)
    d["sources"] = dict(r.sources)
    return d


def rank_dict(r: RankLedger) -> Dict[str, Any]:
    d: Dict[str, Any] = {"rank": r.rank}
    d.update(runner_dict(r.target, r.reserve_bytes))
    d["req_to_token_bytes"] = r.req_to_token_bytes
    d["final_avail_bytes"] = r.final_avail_bytes
    d["unexplained_bytes"] = r.unexplained_bytes
    d["sources"] = {**d["sources"], **r.sources}
    d["draft"] = runner_dict(r.draft, None) if r.draft is not None else None
    return d


def verdict_dict(v: Optional[Verdict]) -> Optional[Dict[str, Any]]:
    """The answer first (an additive field of kvforensics.report/1): question, cause, proof, action."""
    if v is None:
        return None
    return {"question": v.question, "cause": v.cause, "cause_finding": v.cause_finding, "proof": v.proof,
            "action": v.action, "action_recommendation": v.action_recommendation}


def _vllm_worker(w: Any) -> Dict[str, Any]:
    return {"rank": w.rank, "weights_bytes": w.weights_bytes, "total_gpu_bytes": w.total_gpu_bytes,
            "gpu_memory_utilization": w.gpu_memory_utilization, "requested_bytes": w.requested_bytes,
            "non_torch_bytes": w.non_torch_bytes, "activation_peak_bytes": w.activation_peak_bytes,
            "cuda_graph_bytes": w.cuda_graph_bytes, "cuda_graph_estimate_bytes": w.cuda_graph_estimate_bytes,
            "available_kv_bytes": w.available_kv_bytes, "kv_allocated_bytes": w.kv_allocated_bytes,
            "free_at_start_bytes": w.free_at_start_bytes, "sources": dict(w.sources)}


def vllm_target_dict(a: Any) -> Dict[str, Any]:
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
            "ranks": [_vllm_worker(w) for w in a.ranks],
        },
        "findings": [finding_dict(f) for f in a.findings],
        "recommendations": [recommendation_dict(r) for r in a.recommendations],
        "verdict": verdict_dict(getattr(a, "verdict", None)),
    }


def target_dict(a: Analysis) -> Dict[str, Any]:
    if getattr(a, "engine", "sglang") == "vllm":
        return vllm_target_dict(a)
    b = a.budget
    failure = a.failed
    return {
        "target": a.target,
        "status": a.status,
        "problems": [{"code": p.code, "message": p.message} for p in a.problems],
        "engine": {
            "name": "sglang",
            "version_hint": a.era.hint,
            "version_clues": list(a.era.clues),
            "server_args": redact(a.server_args),
        },
        "startup": {
            "index": a.startup_index,
            "count": a.startup_count,
            "first_line": a.startup_first_line,
            "max_total_num_tokens": a.summary.max_total_num_tokens,
            "max_running_requests": a.summary.max_running_requests,
            "context_len": a.summary.context_len,
            "startup_avail_bytes": a.summary.startup_avail_bytes,
            "failure": None if failure is None else {
                "cause": failure.cause, "message": failure.message, "stage": failure.stage,
                "rank": failure.rank, "line": failure.line, "offset": failure.offset},
            "complete": a.complete,
            "stages": {rank: list(seen) for rank, seen in a.progress.per_rank},
            "budget": {
                "mem_fraction_static": b.mfs,
                "mem_fraction_static_source": b.mfs_source or None,
                "pre_load_avail_min_bytes": b.pre_min_bytes,
                "post_load_avail_min_bytes": b.post_min_bytes,
                "reserve_bytes": b.reserve_bytes,
                "rest_bytes": b.rest_bytes,
                "bytes_per_token": b.cell_bytes,
                "bytes_per_token_source": b.cell_source or None,
                "predicted_tokens": b.predicted_tokens,
                "predicted_tokens_low": b.predicted_low,
                "predicted_tokens_high": b.predicted_high,
                "logged_tokens": b.logged_tokens,
                "verdict": b.verdict,
                "explanation": b.explanation,
                "steps": list(b.steps),
                "draft_in_budget": b.draft_in_budget,
            },
            "ranks": [rank_dict(r) for r in a.ranks],
        },
        "findings": [finding_dict(f) for f in a.findings],
        "recommendations": [recommendation_dict(r) for r in a.recommendations],
        "verdict": verdict_dict(a.verdict),
    }


def finding_dict(f: Finding) -> Dict[str, Any]:
    return {"code": f.code, "severity": f.severity, "title": f.title, "detail": f.detail, "bytes": f.bytes,
            "evidence": list(f.evidence)}


def recommendation_dict(r: Recommendation) -> Dict[str, Any]:
    """Both request gains always present: null when a recommendation cannot say (a failed startup's
    fix, a graph-size change), never an empty object."""
    gains = {key: r.gain_requests.get(key) for key in ("at_context_len", "at_request_tokens")}
    return {"flag": r.flag, "value": r.value, "gain_bytes": r.gain_bytes, "gain_tokens": r.gain_tokens,
            "gain_requests": gains, "basis": r.basis, "rationale": r.rationale}


def inspection_dict(insp: Inspection) -> Dict[str, Any]:
    """An inspect target: the analyze keys (from the engine's log, when read) plus live GPUs."""
    if insp.analysis is not None:
        d = target_dict(insp.analysis)
    else:
        d = {"engine": {"name": insp.engine_kind or "sglang", "version_hint": None, "version_clues": [],
                        "server_args": redact(insp.engine_args)} if insp.engine_args is not None else None,
             "startup": None}
    d["target"] = insp.target
    d["status"] = insp.status
    d["problems"] = [{"code": p.code, "message": p.message} for p in insp.problems] + (
        [p for p in d.get("problems", []) if p["code"].startswith("log.")] if insp.analysis else [])
    d["host"] = insp.snapshot.hostname
    d["gpus"] = [gpu_dict(g) for g in insp.gpus]
    hm = insp.host_memory
    d["host_memory"] = {k: hm.get(k) for k in ("total_bytes", "available_bytes", "swap_total_bytes",
                                               "swap_free_bytes", "cgroup_limit_bytes")}
    d["findings"] = [finding_dict(f) for f in insp.findings]
    d["recommendations"] = [recommendation_dict(r) for r in insp.recommendations]
    d["verdict"] = verdict_dict(insp.verdict)
    order = ["target", "status", "host", "problems", "engine", "startup", "gpus", "host_memory", "findings",
             "recommendations", "verdict"]
    return {k: d.get(k) for k in order}


def gpu_dict(g: GpuLedger) -> Dict[str, Any]:
    return {"index": g.index, "uuid": g.uuid, "name": g.name, "status": g.status, "rank": g.rank,
            "total_bytes": g.total_bytes, "reserved_bytes": g.reserved_bytes, "used_bytes": g.used_bytes,
            "free_bytes": g.free_bytes,
            "processes": [{"pid": p.pid, "used_bytes": p.used_bytes, "name": p.name, "rank": p.rank,
                           "owner": p.owner.value,
                           "user": p.user, "container": p.container} for p in g.processes],
            "ledger": [{"item": ITEM_LABELS[item.kind], "bytes": item.bytes,
                        "source": item.source} for item in g.items],
            "problems": [{"code": p.code, "message": p.message} for p in g.problems]}


def render_results(results: List[Any]) -> str:
    """Inspections and failed targets (``TargetFailure``), in target order."""
    targets = [error_target(r.target, r.status, r.code, r.message) if isinstance(r, TargetFailure)
               else inspection_dict(r) for r in results]
    return dumps(document(targets))


def error_target(target: str, status: str, code: str, message: str) -> Dict[str, Any]:
    """A target that produced no analysis (unreadable input, unreachable host)."""
    return {"target": target, "status": status, "problems": [{"code": code, "message": message}],
            "engine": None, "startup": None, "findings": [], "recommendations": [], "verdict": None}


def document(targets: Iterable[Dict[str, Any]]) -> Dict[str, Any]:
    return {"schema": SCHEMA, "targets": list(targets)}


def dumps(doc: Any) -> str:
    """Strict JSON: a non-finite float (a forged bundle's 1e999, NaN in server_args) becomes null,
    and json would refuse any that slipped through rather than print Infinity."""
    return json.dumps(_finite(doc), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def render(analyses: List[Analysis], errors: Iterable[Dict[str, Any]] = ()) -> str:
    doc = document([target_dict(a) for a in analyses] + list(errors))
    return dumps(doc)
