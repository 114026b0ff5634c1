"""SGLang, as the forensics model sees it: the one object the engine-neutral code reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from kvforensics.agent.plugin import EngineModel, LoadMetrics
from kvforensics.collectors.registry import lazy, lazy_rows
from kvforensics.collectors.units import gib

if TYPE_CHECKING:
    from kvforensics.agent.model.context import Context


def foreign_cost(ctx: "Context", process: Any, engine_gpus: int, cell: Optional[int]) -> str:
    """SGLang sizes every rank's KV pool from the least free memory across ranks (research §1)."""
    if not cell:
        return ""
    return (" SGLang sizes every rank's KV pool from the minimum free memory across ranks, so while it "
            "runs a restart gives all {} rank(s) {} less each: {:,} KV tokens per rank.").format(
                engine_gpus, gib(process.used_bytes), process.used_bytes // cell)


ENGINE = EngineModel(
    name="sglang",
    # Its analysis, rules and recommenders load when its startup or its server is there: a node without SGLang
    # (no engine, or another one) never imports them.
    build_analysis=lazy("kvforensics.agent.sglang.analysis:build_analysis"),
    headlines=lazy_rows("kvforensics.agent.sglang.rules:HEADLINES"),
    rules=lazy_rows("kvforensics.agent.sglang.rules:RULES"),
    recommenders=lazy_rows("kvforensics.agent.sglang.recommend:RECOMMENDERS"),
    place=lazy("kvforensics.agent.sglang.live:place"),  # a live node only: a pasted log never loads its records
    budget_flag="--mem-fraction-static",
    # collectors/sglang/http.py WANTED: the scheduler's gauges (with --enable-metrics)
    load=LoadMetrics(running="sglang:num_running_reqs", queued="sglang:num_queue_reqs",
                     kv_usage=("sglang:token_usage",), used_tokens="sglang:num_used_tokens",
                     shown=(("sglang:num_running_reqs", "running", "{:.0f}"),
                            ("sglang:num_queue_reqs", "queued", "{:.0f}"),
                            ("sglang:token_usage", "KV token usage", "{:.0%}"),
                            ("sglang:num_used_tokens", "tokens in use", "{:,.0f}"))),
    process_hint=("`sglang.launch_server`", "`sglang serve`", "`sglang::scheduler*`"),
    foreign_cost=foreign_cost,
    node_rules=(lazy("kvforensics.agent.sglang.hicache:host_ram_offload"),),
    log_imbalance=lazy("kvforensics.agent.sglang.imbalance:log_imbalance"),
)
