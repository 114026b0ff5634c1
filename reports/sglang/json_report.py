"""An SGLang startup in the JSON report: the shared keys, its summary, budget and per-rank ledger."""

from __future__ import annotations

from typing import Any, Dict, Optional

from kvforensics.agent.sglang.analysis import Analysis
from kvforensics.agent.sglang.ledger import RankLedger, RunnerLedger
from kvforensics.reports.json_report import finding_dict, recommendation_dict, redact, verdict_dict

RUNNER_KEYS = ("dist_init_bytes", "pre_load_avail_bytes", "weights_bytes", "post_load_avail_bytes",
               "kv_tokens", "kv_bytes", "bytes_per_token", "pool_end_avail_bytes", "graph_bytes",
               "graph_end_avail_bytes")
EXTRA_RUNNER_KEYS = ("mamba_bytes", "workspace_bytes", "model_type")


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


def target_dict(a: Analysis) -> Dict[str, Any]:
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
