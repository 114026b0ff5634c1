"""How far a startup got, and how it died: the truth a fragment or a crash log can tell.

A startup passes through stages, per rank: distributed init, weights, the KV pool, attention
workspaces, CUDA-graph capture, the draft model (speculative decoding), and the scheduler's
summary line. A log that stops before the summary is a fragment: its last free-memory figure is
what was free *then*, before later consumers (graphs, the draft, the crash). A startup that
ends in an exception failed; its stage comes from the cause (SGLang's own messages say where
they are raised) or from the traceback's frames, else from the last stage the log shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from kvforensics.agent.model.citing import CitesEvent, where
from kvforensics.agent.sglang.attribution import Attributed
from kvforensics.collectors.events import LogEvent

STAGES = ("dist_init", "weights", "kv_pool", "workspaces", "graph_capture", "draft", "summary")
STAGE_WORDS = {
    "dist_init": "distributed init", "weights": "loading the weights", "kv_pool": "sizing the KV pool",
    "workspaces": "allocating attention workspaces", "graph_capture": "CUDA graph capture",
    "draft": "the draft model", "summary": "the scheduler summary", "unknown": "an unknown stage",
}
# The line that shows a stage was reached, per runner event kind.
_STAGE_OF_KIND = {"dist_init_end": "dist_init", "load_end": "weights", "kv_pool": "kv_pool", "swa_pool": "kv_pool",
                  "pool_end": "kv_pool", "graph_begin": "workspaces", "graph_end": "graph_capture",
                  "graph_progress": "graph_capture",
                  "post_capture_kv": "graph_capture"}
# Where SGLang raises each specific failure (release wheels 0.2.15–0.5.23, sglang_source_facts §8).
_CAUSE_STAGE = {"cuda_graph_capture_failed": "graph_capture", "not_enough_memory": "kv_pool",
                "no_kv_budget": "kv_pool", "weights_leave_no_memory": "kv_pool", "unbalanced_memory": "dist_init",
                "host_memory_short": "kv_pool"}
# Generic causes, most telling first: a process's own exception before the parent noticing it died.
GENERIC_CAUSES = ("exception", "scheduler_died", "child_failed")
# Traceback frames (function names in SGLang's model runner and scheduler) → stage.
_FRAME_STAGE = (
    (("init_torch_distributed", "initialize_model_parallel", "init_distributed_environment",
      "measure_pre_model_load_memory", "_check_tp_memory_balance"), "dist_init"),
    (("load_model", "load_weights", "load_weights_and_postprocess"), "weights"),
    (("init_memory_pool", "profile_max_num_token", "init_cache_with_memory_pool", "_init_pools",
      "handle_max_mamba_cache", "configure_pools"), "kv_pool"),
    (("init_attention_backend", "init_cublas"), "workspaces"),
    (("init_device_graphs", "init_cuda_graphs", "capture", "capture_one_batch_size"), "graph_capture"),
)


@dataclass(frozen=True)
class Failure(CitesEvent):
    """Why a startup did not finish."""

    cause: str  # stable code: cuda_graph_capture_failed, cuda_out_of_memory, nccl_error, exception, …
    stage: str  # one of STAGES (not "summary"), or "unknown"
    stage_source: str  # "the message", "traceback frames", "the last stage the log shows"
    message: str  # the exception's own words, shortened
    rank: Optional[str]  # the rank tag of the failing line, when it had one
    event: LogEvent  # the failure line the evidence cites
    draft: bool  # it happened in the draft model's runner


@dataclass(frozen=True)
class Progress:
    """The stages a startup's lines show, per rank, and the last one reached."""

    per_rank: Tuple[Tuple[str, Tuple[str, ...]], ...]  # (rank, stages seen), in rank order
    last_stage: Optional[str]
    last_event: Optional[LogEvent]  # the line of the last stage reached
    complete: bool  # the scheduler summary was printed

    def missing(self) -> List[str]:
        seen = {s for _, stages in self.per_rank for s in stages}
        return [s for s in STAGES if s not in seen and s != "draft"]


def _order(ev: LogEvent) -> Tuple[int, int]:
    return (ev.offset, ev.line or 0)


def progress(attributed: Attributed) -> Progress:
    per_rank = []
    last: Optional[Tuple[str, LogEvent]] = None
    for rank in attributed.ranks:
        seen: List[str] = []
        for runner, is_draft in ((rank.target, False), (rank.draft, True)):
            for ev in runner.events:
                stage = "draft" if is_draft else _STAGE_OF_KIND.get(ev.kind)
                if stage is None:
                    continue
                if stage not in seen:
                    seen.append(stage)
                if last is None or _order(ev) > _order(last[1]):
                    last = (stage, ev)
        per_rank.append((rank.rank, tuple(s for s in STAGES if s in seen)))
    complete = bool(attributed.summaries)
    if complete:
        summary = attributed.summaries[0]
        last = ("summary", summary)
    return Progress(per_rank=tuple(per_rank), last_stage=last[0] if last else None,
                    last_event=last[1] if last else None, complete=complete)


def _frame_stage(frames: Sequence[LogEvent]) -> Tuple[Optional[str], bool]:
    """(stage, in the draft runner) from the traceback's frames, innermost known frame wins."""
    stage = None
    draft = False
    for f in frames:
        path, func = str(f.data.get("path", "")), str(f.data.get("func", ""))
        if "eagle" in path or "draft" in path or "draft" in func:
            draft = True
        for funcs, name in _FRAME_STAGE:
            if func in funcs:
                stage = name
    return stage, draft


def failure(events: Sequence[LogEvent], attributed: Attributed, prog: Progress) -> Optional[Failure]:
    """The startup's failure, or None when it finished (a summary) or shows none."""
    if prog.complete:
        return None
    failures = [e for e in events if e.kind == "failure"]
    exceptions = [e for e in events if e.kind == "exception"]
    if not failures and not exceptions:
        return None
    primary = _primary_failure(failures, exceptions)
    cause = str(primary.data.get("cause", "exception"))
    said = _exception_after(primary, exceptions)
    message = said.text if said is not None and primary.kind != "exception" else primary.text
    stage, how, draft = _failed_stage(cause, events, prog)
    rank = primary.rank or (said.rank if said is not None else None)
    return Failure(cause=cause, stage=stage, stage_source=how,
                   message=message if len(message) <= 300 else message[:297] + "...", rank=rank or None,
                   event=primary, draft=draft)


def _primary_failure(failures: List[LogEvent], exceptions: List[LogEvent]) -> LogEvent:
    """The line that explains the others: a specific cause, else the most telling generic one
    (GENERIC_CAUSES' order), else the first exception."""
    specific = [e for e in failures if e.data.get("cause") not in GENERIC_CAUSES]
    generic = sorted((e for e in failures if e.data.get("cause") in GENERIC_CAUSES),
                     key=lambda e: GENERIC_CAUSES.index(str(e.data.get("cause"))))
    return (specific or generic or exceptions)[0]


def _exception_after(primary: LogEvent, exceptions: List[LogEvent]) -> Optional[LogEvent]:
    """The exception at or after the failure line that says what went wrong: the first with text,
    else the first."""
    after = [e for e in exceptions if _order(e) >= _order(primary)]
    return next((e for e in after if e.data.get("text")), after[0] if after else None)


def _failed_stage(cause: str, events: Sequence[LogEvent], prog: Progress) -> Tuple[str, str, bool]:
    """(the stage it died in, how that is known, whether the draft's runner raised it)."""
    # A traceback's frames come before the exception line that ends it: read all of the startup's.
    frame_stage, draft = _frame_stage([e for e in events if e.kind == "frame"])
    if cause in _CAUSE_STAGE:
        stage, how = _CAUSE_STAGE[cause], "the message"
    elif frame_stage is not None:
        stage, how = frame_stage, "traceback frames"
    else:
        stage, how = _after_last_stage(prog)
    if draft:  # the draft model's runner raised it: that is the stage that failed
        stage, how = "draft", how + "; the traceback runs through the draft worker"
    return stage, how, draft


def _after_last_stage(prog: Progress) -> Tuple[str, str]:
    """With nothing else to go on, the failure came in the stage after the last one reached."""
    if prog.last_stage is None:
        return "unknown", "nothing in the log shows how far it got"
    following = {"dist_init": "weights", "weights": "kv_pool", "kv_pool": "workspaces", "workspaces": "graph_capture",
                 "graph_capture": "graph_capture", "draft": "draft"}
    return following.get(prog.last_stage, "unknown"), "the last stage the log shows ({}, {})".format(
        prog.last_stage, where(prog.last_event))
