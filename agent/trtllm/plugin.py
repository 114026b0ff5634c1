"""TensorRT-LLM, as the forensics model sees it: the one object the engine-neutral code reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from kvforensics.agent.plugin import EngineModel, LoadMetrics
from kvforensics.collectors.registry import lazy, lazy_rows

if TYPE_CHECKING:
    from kvforensics.agent.model.context import Context


def foreign_cost(ctx: "Context", process: Any, engine_gpus: int, cell: Optional[int]) -> str:
    """TensorRT-LLM's budget is a share of the memory free when it is sized: a process beside a rank shrinks the
    next start's KV cache by its size × the fraction (the PyTorch backend's profiled peak counts it too)."""
    return (" TensorRT-LLM sizes its KV cache as a share of the memory free at startup (after the profiled peak in "
            "the PyTorch backend), so this process shrinks the next start's KV cache by about its size × "
            "free_gpu_memory_fraction.")


ENGINE = EngineModel(
    name="trtllm",
    build_analysis=lazy("kvforensics.agent.trtllm.analysis:build_analysis"),
    headlines=lazy_rows("kvforensics.agent.trtllm.rules:HEADLINES"),
    rules=lazy_rows("kvforensics.agent.trtllm.rules:RULES"),
    recommenders=lazy_rows("kvforensics.agent.trtllm.recommend:RECOMMENDERS"),
    place=lazy("kvforensics.agent.trtllm.live:place"),
    budget_flag="--kv_cache_free_gpu_memory_fraction",
    # trtllm-serve's Prometheus page (collectors/trtllm/http.py names what it reads).
    load=LoadMetrics(running="trtllm_num_requests_running", queued="trtllm_num_requests_waiting",
                     kv_usage=("trtllm_kv_cache_utilization",),
                     shown=(("trtllm_num_requests_running", "running", "{:.0f}"),
                            ("trtllm_num_requests_waiting", "waiting", "{:.0f}"),
                            ("trtllm_kv_cache_utilization", "KV cache usage", "{:.0%}"))),
    process_hint=("`trtllm-serve`", "`tritonserver` (tensorrtllm backend)", "`python -m dynamo.trtllm`"),
    budget_of_total=False,
    # The PyTorch backend's profiled peak (activations for max_num_tokens) returns while serving: without its
    # log, NVML's free memory is not spare.
    frees_profiled_peak=True,
    foreign_cost=foreign_cost,
    node_rules=(lazy("kvforensics.agent.trtllm.scheduler:scheduler_reserves"),),
)
