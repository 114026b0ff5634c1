"""TensorRT-LLM's capacity scheduler on a live node: GUARANTEED_NO_EVICT (the default of trtllm-serve, the LLM API,
the C++ executor and Triton: tensorrt_llm/llmapi/llm_args.py SchedulerConfig, batch_manager
capacityScheduler.cpp) admits a request only when the KV cache can hold it to its maximum length, so requests
wait while much of the cache is still free; MAX_UTILIZATION fills the cache and pauses (evicts) requests when
it runs out. Said only on the evidence of the server's own metrics: requests waiting while the KV cache is far
from full."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from kvforensics.agent.model.records import Finding

if TYPE_CHECKING:
    from kvforensics.agent.model.context import Context

FULL_ENOUGH = 0.7  # a cache used past this is full in practice: waiting is the cache's size, not the policy


def scheduler_reserves(ctx: "Context") -> Iterator[Finding]:
    insp = ctx.live
    if insp is None or insp.analysis is None:
        return
    metrics = insp.snapshot.http.metrics
    waiting = metrics.get("trtllm_num_requests_waiting")
    usage = metrics.get("trtllm_kv_cache_utilization")
    policy = str(insp.analysis.server_args.get("capacity_scheduler_policy") or "GUARANTEED_NO_EVICT").upper()
    if not waiting or usage is None or usage >= FULL_ENOUGH or policy != "GUARANTEED_NO_EVICT":
        return
    yield Finding(
        code="scheduler_reserves_kv", severity="warning",
        title="{:.0f} request(s) wait while the KV cache is {:.0%} used: GUARANTEED_NO_EVICT reserves each request's "
        "maximum length".format(waiting, usage),
        detail="TensorRT-LLM's default capacity scheduler admits a request only when the KV cache can hold it up to "
        "its max_tokens (its whole completion), so the pool's free blocks are promised, not used. "
        "scheduler_config.capacity_scheduler_policy: MAX_UTILIZATION (Triton: batch_scheduler_policy "
        "max_utilization) admits by what is used now and pauses requests when the cache runs out; or lower the "
        "requests' max_tokens to what they need. Live ({}{}): {:.0f} waiting, KV cache {:.0%} used.".format(
            insp.snapshot.http.url, insp.snapshot.http.metrics_path, waiting, usage),
        evidence=("{}{}".format(insp.snapshot.http.url, insp.snapshot.http.metrics_path),),
        action="set scheduler_config.capacity_scheduler_policy: MAX_UTILIZATION, or send smaller max_tokens")
