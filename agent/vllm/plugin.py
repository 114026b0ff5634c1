"""vLLM, as the forensics model sees it: the one object the engine-neutral code reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from kvforensics.agent.model.node_rules import live_settings
from kvforensics.agent.plugin import EngineModel, LoadMetrics
from kvforensics.collectors.registry import lazy, lazy_rows

if TYPE_CHECKING:
    from kvforensics.agent.model.context import Context


def foreign_cost(ctx: "Context", process: Any, engine_gpus: int, cell: Optional[int]) -> str:
    """vLLM's budget is T·u whatever else runs: a process beside a worker must fit beside it."""
    fixed = getattr(ctx.analysis, "fixed_kv_size", None)
    if fixed is not None and ctx.live is not None and fixed(live_settings(ctx.live)):
        return (" vLLM's KV cache is fixed by --kv-cache-memory-bytes: this process must fit beside it, or "
                "the next start runs out of memory.")
    return (" vLLM's budget is a share of the GPU's total (--gpu-memory-utilization × total), not of the "
            "free memory: this process must fit beside it, and on a restart vLLM ≥ 0.9.1 refuses to "
            "start while free memory is below that share (older releases shrink the KV cache or "
            "over-commit).")


ENGINE = EngineModel(
    name="vllm",
    # Its analysis, rules and recommenders load when its startup or its server is there: a node without vLLM
    # (no engine, or another one) never imports them.
    build_analysis=lazy("kvforensics.agent.vllm.analysis:build_analysis"),
    headlines=lazy_rows("kvforensics.agent.vllm.rules:HEADLINES"),
    rules=lazy_rows("kvforensics.agent.vllm.rules:RULES"),
    recommenders=lazy_rows("kvforensics.agent.vllm.recommend:RECOMMENDERS"),
    place=lazy("kvforensics.agent.vllm.live:place"),  # a live node only: a pasted log never loads its records
    budget_flag="--gpu-memory-utilization",
    # The V1 and V0 names (collectors/vllm/metrics.py); usage is a share of its blocks, not a token count.
    load=LoadMetrics(running="vllm:num_requests_running", queued="vllm:num_requests_waiting",
                     kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                     shown=(("vllm:num_requests_running", "running", "{:.0f}"),
                            ("vllm:num_requests_waiting", "waiting", "{:.0f}"),
                            ("vllm:kv_cache_usage_perc", "KV cache usage", "{:.0%}"),
                            ("vllm:gpu_cache_usage_perc", "KV cache usage", "{:.0%}"),
                            ("vllm:num_preemptions_total", "preemptions since start", "{:,.0f}"))),
    process_hint=("`vllm serve`", "`vllm.entrypoints.openai.api_server`", "`VLLM::*`"),
    budget_of_total=True,
    frees_profiled_peak=True,
    foreign_cost=foreign_cost,
)
