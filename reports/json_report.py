"""The JSON report, schema ``kvforensics.report/1`` (documented in README, pinned by tests).

Sizes are integer bytes; unknown values are null, never 0. Secrets that an engine prints in its
arguments (API keys, tokens) are replaced by ``"<redacted>"``. Each engine adds its own startup
figures (``reports/<engine>/json_report.py``).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional

from kvforensics.agent.model.records import Finding, Recommendation, Verdict
from kvforensics.agent.plugin import EngineAnalysis
from kvforensics.collectors.redact import redact_mapping
from kvforensics.reports.labels import ITEM_LABELS
from kvforensics.reports.plugin import VIEWS

if TYPE_CHECKING:
    from kvforensics.agent.model.live import GpuLedger, Inspection

SCHEMA = "kvforensics.report/1"


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


def verdict_dict(v: Optional[Verdict]) -> Optional[Dict[str, Any]]:
    """The answer first (an additive field of kvforensics.report/1): question, cause, proof, action."""
    if v is None:
        return None
    return {"question": v.question, "cause": v.cause, "cause_finding": v.cause_finding,
            "symptom_finding": v.symptom_finding, "proof": v.proof, "action": v.action,
            "action_recommendation": v.action_recommendation}


def finding_dict(f: Finding) -> Dict[str, Any]:
    return {"code": f.code, "severity": f.severity, "title": f.title, "detail": f.detail, "bytes": f.bytes,
            "evidence": list(f.evidence)}


def recommendation_dict(r: Recommendation) -> Dict[str, Any]:
    """Both request gains always present: null when a recommendation cannot say (a failed startup's
    fix, a graph-size change), never an empty object."""
    gains = {key: r.gain_requests.get(key) for key in ("at_context_len", "at_request_tokens")}
    return {"flag": r.flag, "value": r.value, "gain_bytes": r.gain_bytes, "gain_tokens": r.gain_tokens,
            "gain_requests": gains, "basis": r.basis, "rationale": r.rationale}


def target_dict(a: EngineAnalysis) -> Dict[str, Any]:
    """An analysed startup: the keys every engine shares, with its engine's own figures
    (reports/<engine>/plugin.py)."""
    return VIEWS.get(a.engine).json_target(a)


def inspection_dict(insp: Inspection) -> Dict[str, Any]:
    """An inspect target: the analyze keys (from the engine's log, when read) plus live GPUs."""
    if insp.analysis is not None:
        d = target_dict(insp.analysis)
    else:
        d = {"engine": {"name": insp.engine_kind, "version_hint": None, "version_clues": [],
                        "server_args": redact(insp.engine_args)} if insp.engine_args is not None else None,
             "startup": None}
    d["target"] = insp.target
    d["status"] = insp.status
    d["problems"] = [{"code": p.code, "message": p.message} for p in insp.problems] + (
        # the analysis's own: what its log lacks, and flags it could not type (the node's are said above)
        [p for p in d.get("problems", []) if p["code"].startswith(("log.", "server_args."))] if insp.analysis else [])
    d["host"] = insp.snapshot.hostname
    d["pod"] = pod_dict(insp)
    d["gpus"] = [gpu_dict(g) for g in insp.gpus]
    hm = insp.host_memory
    d["host_memory"] = {k: hm.get(k) for k in ("total_bytes", "available_bytes", "swap_total_bytes",
                                               "swap_free_bytes", "cgroup_limit_bytes")}
    d["findings"] = [finding_dict(f) for f in insp.findings]
    d["recommendations"] = [recommendation_dict(r) for r in insp.recommendations]
    d["verdict"] = verdict_dict(insp.verdict)
    order = ["target", "status", "host", "pod", "problems", "engine", "startup", "gpus", "host_memory", "findings",
             "recommendations", "verdict"]
    return {k: d.get(k) for k in order}


def pod_dict(insp: Inspection) -> Optional[Dict[str, Any]]:
    """The Kubernetes pod of the engine explained, or None (not in a pod, or the node does not name it)."""
    pod = insp.snapshot.engine_pod
    if pod is None:
        return None
    return {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid, "container": pod.container, "qos": pod.qos}


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
    from kvforensics.agent.model.live import TargetFailure  # a node's records: `analyze LOG` never loads them

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


def render(analyses: List[EngineAnalysis], errors: Iterable[Dict[str, Any]] = ()) -> str:
    doc = document([target_dict(a) for a in analyses] + list(errors))
    return dumps(doc)
