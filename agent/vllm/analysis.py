"""One vLLM startup's analysis: per-worker memory ledgers, the era's budget formula, the failure.

Pure: no I/O. The era table (facts from the release wheels): ``u`` (--gpu-memory-utilization)
always multiplies the device total ``T``; what is subtracted from ``T·u`` changed by release:

* V0-a 0.3.3–0.6.3: ``KV = T·u − (init_free − free_after_profile)``; graphs outside the budget.
* V0-b 0.6.4.x and V1-a (V1 ≤ 0.9.0): ``KV = T·u − torch_peak − non_torch`` (other processes in).
* V0-c 0.6.5–0.10.2, V1-b 0.9.1–0.10.2, V1-c 0.11–0.17, V1-d 0.18–0.19: ``KV = T·u − (W + A + N)``;
  graphs outside ``T·u`` (0.18–0.19 only log an estimate).
* V1-e 0.20–0.26: ``KV = ceil(T·u) − (W + A + N) − G_est``: graphs inside; default u 0.92.
* V1-f 0.27+: ``KV = ceil(T·u) − consumed − transient − G_est`` (free-delta accounting).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from kvforensics.agent.model import flags
from kvforensics.agent.model.citing import CitesEvent, where
from kvforensics.agent.model.geometry import GeometryError, KvGeometry
from kvforensics.agent.model.records import Finding, KvChange, KvCheck, Options, Problem, Recommendation
from kvforensics.agent.vllm import kv_geometry
from kvforensics.collectors.events import LogEvent
from kvforensics.collectors.lineformat import Version
from kvforensics.collectors.units import gib
from kvforensics.collectors.vllm.formats import BY_NAME, GENERIC_CAUSES, PRINT_TOLERANCE_BYTES, arg_values, whole_items
from kvforensics.collectors.vllm.startups import Startup

ERAS = (  # (name, since, until, graphs inside the budget)
    ("V0-a", (0, 3, 3), (0, 6, 3), False), ("V0-b", (0, 6, 4), (0, 6, 4), False),
    ("V0-c", (0, 6, 5), (0, 10, 2), False), ("V1-a", (0, 6, 5), (0, 9, 0), False),
    ("V1-b", (0, 9, 1), (0, 10, 2), False), ("V1-c", (0, 11, 0), (0, 17, 99), False),
    ("V1-d", (0, 18, 0), (0, 19, 99), False), ("V1-e", (0, 20, 0), (0, 26, 99), True),
    ("V1-f", (0, 27, 0), (99, 0, 0), True),
)
# One process's CUDA context, which no vLLM line prints: 527 MiB of free memory on an H200 with driver
# 580.159 (bench/RESULTS.md, gpu-check 2026-11-30; NVML charged the process 518 MiB beyond its allocation).
CUDA_CONTEXT_BYTES = 527 << 20
UTILIZATION_ROUNDING = ("--gpu-memory-utilization is u + spare ÷ T rounded down to 0.01, so the budget grows by a "
                        "little less than the spare, never more (and a cut gives back at least the shortfall)")
# A worker process's prefix, every era's name: "Worker_TP1 pid=9", "VllmWorker TP0 pid=9", "VllmWorkerProcess pid=9",
# "RayWorkerWrapper pid=9".
_WORKER_TAG = re.compile(r"Worker")
_V1_KINDS = ("available_kv", "kv_tokens", "graph_estimate", "graph_advisory", "suggestion", "graph_pool")
_V1_FMTS = ("free_short", "maxlen_v1", "engine_failed")
_V0_FMTS = ("profile_takes", "profile_budget", "profile_breakdown", "profile_global", "graph_begin",
            "graph_begin_old", "maxlen_v0", "worker_died")
STAGES = ("weights", "profiling", "kv_cache", "graph_capture", "ready")
STAGE_WORDS = {"init": "worker init (the free-memory check)", "weights": "loading the weights",
               "profiling": "the memory profiling run", "kv_cache": "sizing the KV cache",
               "graph_capture": "CUDA graph capture", "ready": "engine ready", "unknown": "an unknown stage"}
_STAGE_OF_KIND = {"weights": "weights", "profile_begin": "profiling", "budget": "profiling",
                  "breakdown": "kv_cache", "global_profile": "kv_cache", "available_kv": "kv_cache",
                  "blocks": "kv_cache", "kv_tokens": "kv_cache", "concurrency": "kv_cache",
                  "graph_begin": "graph_capture", "graph_end": "graph_capture", "init_done": "ready",
                  "serving": "ready"}
_CAUSE_STAGE = {"insufficient_free_memory": "init", "max_model_len_too_large": "kv_cache",
                "no_kv_memory": "kv_cache", "memory_freed_during_profiling": "profiling"}
_FRAME_STAGE = (
    (("init_device", "request_memory"), "init"),
    (("load_model", "load_weights"), "weights"),
    (("determine_num_available_blocks", "determine_available_memory", "profile_run", "_dummy_run",
      "profile_num_available_blocks"), "profiling"),
    (("get_kv_cache_config", "get_kv_cache_configs", "check_enough_kv_cache_memory", "initialize_cache",
      "raise_if_cache_size_invalid", "_verify_args", "initialize_from_config"), "kv_cache"),
    (("capture_model", "capture", "compile_or_warm_up_model", "capture_end"), "graph_capture"),
)


@dataclass(frozen=True)
class Worker:
    """One worker's memory, as its lines print it (bytes; None = not in the log)."""

    rank: str  # the process prefix inside the parentheses ("Worker_TP0 pid=26347"), "" without one
    total_gpu_bytes: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None
    requested_bytes: Optional[int] = None
    weights_bytes: Optional[int] = None
    non_torch_bytes: Optional[int] = None
    activation_peak_bytes: Optional[int] = None
    cuda_graph_bytes: Optional[int] = None
    cuda_graph_estimate_bytes: Optional[int] = None
    available_kv_bytes: Optional[int] = None
    kv_allocated_bytes: Optional[int] = None  # blocks × page bytes: needs the page size (not in the log)
    free_at_start_bytes: Optional[int] = None
    # 0.6.4.x (and 0.6.5 dev builds) 'Memory profiling results:': T − free before profiling, the torch
    # allocation peak (weights included), T − free after it (worker.py determine_num_available_blocks)
    initial_usage_bytes: Optional[int] = None
    peak_torch_bytes: Optional[int] = None
    post_profile_usage_bytes: Optional[int] = None
    sources: Dict[str, str] = field(default_factory=dict)

    # node_rules reads ranks through ``target.post_load_avail_bytes`` / ``target.sources``.
    @property
    def target(self) -> "Worker":
        return self

    @property
    def post_load_avail_bytes(self) -> Optional[int]:
        return None

    @property
    def kv_bytes(self) -> Optional[int]:
        """The protocol's KV pool per rank: the KV memory vLLM made available."""
        return self.available_kv_bytes


@dataclass(frozen=True)
class Summary:
    """The node_rules protocol's summary: the binding KV report and max_model_len. vLLM prints no
    request-slot count (--max-num-seqs is a flag): max_running_requests stays None, and vLLM's own
    concurrency rule reads 'Maximum concurrency' instead of the shared one."""

    max_total_num_tokens: Optional[int] = None
    max_running_requests: Optional[int] = None
    context_len: Optional[int] = None
    source: str = ""


@dataclass(frozen=True)
class Budget:
    """What the shared node rules read of vLLM's budget: the KV bytes per token (None: the log does not imply it)."""

    cell_bytes: Optional[int] = None  # KV bytes per token, when the log implies it


@dataclass(frozen=True)
class Era:
    """The vLLM family, release interval and era (one of ERAS) a startup's lines point to; None: they do not say."""

    family: Optional[str]  # "V0" | "V1" | None
    since: Optional[Version]
    until: Optional[Version]
    name: Optional[str]  # one of ERAS when the log pins it
    graphs_inside: Optional[bool]  # CUDA graphs inside T·u (True from 0.20.0), None when unknown
    clues: Tuple[str, ...]

    @property
    def conflicting(self) -> bool:
        """The clues contradict each other (no release prints them all): two releases' lines in one
        startup, or an edited log."""
        return self.since is not None and self.until is not None and self.since > self.until

    @property
    def hint(self) -> Optional[str]:
        if self.since is None and self.until is None:
            return self.family
        lo = ".".join(map(str, self.since)) if self.since else "?"
        hi = ".".join(map(str, self.until)) if self.until else "newest"
        if self.conflicting:
            return "{} (conflicting clues: {}+ and ≤ {})".format(self.family or "vLLM", lo, hi)
        return "{} {}–{}".format(self.family or "vLLM", lo, hi)


@dataclass(frozen=True)
class Failure(CitesEvent):
    """Why a vLLM startup did not finish: a stable cause, the stage it failed in and how that was told, its message."""

    cause: str
    stage: str
    stage_source: str
    message: str
    rank: Optional[str]
    event: LogEvent


@dataclass(frozen=True)
class Analysis:
    """One vLLM startup analysed: its era, per-worker ledgers, KV figures, budget checks and failure, then the rule
    book's findings, recommendations and verdict."""

    target: str
    status: str
    problems: Tuple[Problem, ...]
    era: Era
    server_args: Dict[str, Any]
    startup_index: Optional[int]
    startup_count: Optional[int]
    startup_first_line: Optional[int]
    ranks: Tuple[Worker, ...]
    kv_cache_tokens: Optional[int]
    kv_cache_reports: Tuple[int, ...]
    gpu_blocks: Optional[int]
    cpu_blocks: Optional[int]
    max_model_len: Optional[int]
    kv_cache_dtype: Optional[str]
    max_concurrency: Optional[Dict[str, Any]]
    concurrency_source: str
    checks: Tuple[KvCheck, ...]
    stages_seen: Tuple[str, ...]
    last_event: Optional[LogEvent]
    complete: bool
    failure: Optional[Failure]
    options: Options
    events: Tuple[LogEvent, ...] = ()
    findings: Tuple[Finding, ...] = ()
    recommendations: Tuple[Recommendation, ...] = ()
    engine: str = "vllm"
    verdict: Optional[Any] = None  # agent/model/verdict.py: the answer first
    summary: Summary = Summary()
    budget: Budget = Budget()
    geometry: Optional[KvGeometry] = None  # bytes per token from --model-config, vLLM's paging
    geometry_note: Optional[str] = None  # why there is none although a config was given

    def logged_bytes_per_token(self) -> Optional[Tuple[float, Worker]]:
        """The binding worker's KV memory ÷ the binding KV report (any era: from 0.21 the token figure is
        concurrency × max_model_len, still blocks × block size for a uniform full-attention model)."""
        w = self.binding()
        if w is None or not w.available_kv_bytes or not self.kv_cache_tokens:
            return None
        return w.available_kv_bytes / self.kv_cache_tokens, w

    @property
    def failed(self) -> Optional[Failure]:
        return self.failure

    def worker_count(self) -> int:
        """Workers the log shows: every worker process prefix (Worker_TP1 may print no memory line of its own),
        at least the workers with figures, and at least tensor × pipeline parallel when the arguments say it."""
        tags = {e.rank for e in self.events if e.rank and _WORKER_TAG.search(e.rank)}
        sizes = [self.server_args.get(k) for k in ("tensor_parallel_size", "pipeline_parallel_size")]
        parallel = 1
        for size in sizes:
            parallel *= size if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= 4096 else 1
        return max(len(self.ranks), len(tags), parallel)

    def memory_pressure(self) -> str:
        """The log's evidence that memory runs short while serving (an out-of-memory error after the engine was
        ready), for node_rules.pressure; '' when it shows none."""
        ready = ready_event(self.events)
        if ready is None:
            return ""
        oom = next((e for e in self.events if e.kind in ("failure", "exception") and _order(e) > _order(ready)
                    and (e.data.get("cause") == "cuda_out_of_memory" or "out of memory" in e.text.lower())), None)
        return "" if oom is None else "the log shows an out-of-memory error while serving ({})".format(where(oom))

    def binding(self) -> Optional[Worker]:
        """The worker with the least KV memory: every worker gets the minimum's block count."""
        known = [w for w in self.ranks if w.available_kv_bytes is not None]
        return min(known, key=lambda w: w.available_kv_bytes or 0) if known else None

    def default_utilization(self) -> Optional[float]:
        """--gpu-memory-utilization when not given: 0.9, 0.92 from 0.20.0 (config/cache.py); None when the
        log does not say which side of 0.20 it is."""
        if self.era.since is not None and self.era.since >= (0, 20, 0):
            return 0.92
        if self.era.until is not None and self.era.until < (0, 20, 0):
            return 0.9
        return None

    def fixed_kv_size(self, flags: Dict[str, Any]) -> bool:
        """--kv-cache-memory-bytes sets the KV cache directly (any form: vLLM reads "50G" and "8Gi" too,
        arg_utils human_readable_int); then u sizes nothing."""
        return any(source.get("kv_cache_memory_bytes") not in (None, "", "None", False)
                   for source in (flags, self.server_args))

    def fraction(self, flags: Dict[str, Any]) -> Optional[Tuple[float, str]]:
        """(--gpu-memory-utilization, where it comes from): the running server's (its command line, or
        its /metrics cache_config), else the log's, else the era's default; None when none of these says,
        or when --kv-cache-memory-bytes fixes the KV cache instead (then u sizes nothing)."""
        if self.fixed_kv_size(flags):
            return None
        given = _given(flags, "gpu_memory_utilization")
        if given is not None:
            return given, "u {:g} from the running server".format(given)
        w = self.sized_worker()
        if w is not None:
            assert w.gpu_memory_utilization is not None
            return w.gpu_memory_utilization, "u {:g} from the log".format(w.gpu_memory_utilization)
        logged = _given(self.server_args, "gpu_memory_utilization")
        if logged is not None:
            return logged, "u {:g} from the log's arguments".format(logged)
        default = self.default_utilization()
        return None if default is None else (default, "u {:g}, this era's default".format(default))

    def process_ceiling(self, cuda_total: int, flags: Dict[str, Any]) -> Optional[Tuple[int, str, bool]]:
        """(bytes, how, others inside) a worker's process may reach on a GPU whose CUDA total is
        ``cuda_total``: the budget T·u at its activation peak, plus the CUDA graph pool where it sits
        outside the budget (``graphs_outside``), plus what no budget covers: from a 'Free memory on
        device (free/total GiB) on startup' line (INFO from 0.27.1, gpu_worker.py determine_available_memory)
        exactly T − free-at-start (the context, NCCL and the other processes already there: ``others
        ``others_held_at_start``), else the CUDA context alone. In 0.6.4.x and V1 ≤ 0.9.0 the budget counts every other
        process and the context inside it (their non-torch figure is the device's whole non-torch use).
        ``how`` lists the terms as they are subtracted from the GPU's memory."""
        got = self.fraction(flags)
        if got is None:
            return None
        u, src = got
        if self.era.name in ("V0-b", "V1-a"):
            ceiling, how = int(cuda_total * u), "T·u ({}; other processes and the CUDA context are inside it in " \
                "this era)".format(src)
            others_inside = True
        else:
            w = self.sized_worker()
            outside = _outside_at_start(w)
            if outside is not None:
                ceiling = int(cuda_total * u) + outside[0]
                how = "T·u ({}) − {}".format(src, outside[1])
            else:
                ceiling = int(cuda_total * u) + CUDA_CONTEXT_BYTES
                how = "T·u ({}) − the CUDA context (~{} MiB){}".format(src, CUDA_CONTEXT_BYTES >> 20, self._nccl_note())
            others_inside = False
        graphs, graphs_how = self.graphs_outside()
        if graphs:
            ceiling += graphs
            how += " − " + graphs_how
        return ceiling, how, others_inside

    def others_held_at_start(self) -> int:
        """Bytes of the other processes' use that the ceiling already holds: what was in use at startup beyond
        the CUDA context (NCCL and the co-tenants then); a live room takes off only the other processes' use
        beyond it (a co-tenant there before startup is not counted twice, one that came later is)."""
        outside = _outside_at_start(self.sized_worker())
        return 0 if outside is None or self.era.name in ("V0-b", "V1-a") else max(0, outside[0] - CUDA_CONTEXT_BYTES)

    def graphs_outside(self) -> Tuple[int, str]:
        """(bytes, how) of the CUDA graph pool outside the budget, the largest worker's:
        * graphs captured after KV sizing (before 0.20; 0.6.4.x and V1 ≤ 0.9.0 too; era unknown: the safe
          side): the whole pool;
        * 0.20+ (Model Runner V1, gpu_worker.py determine_available_memory subtracts the estimate): the part
          of the pool beyond the estimate ('CUDA graph pool memory: … (actual), … (estimated)');
        * Model Runner V2 in 0.22–0.28 (v1/worker/gpu/model_runner.py profile_cudagraph_memory returns 0,
          gpu_worker.py subtracts it only above 0, graphs captured after the KV cache): the whole pool."""
        best = (0, "")
        for w in self.ranks:
            if w.cuda_graph_bytes is None:
                continue
            got = self._graphs_outside_of(w)
            if got[0] > best[0]:
                best = got
        return best

    def _graphs_outside_of(self, w: Worker) -> Tuple[int, str]:
        pool, src = w.cuda_graph_bytes or 0, w.sources.get("cuda_graph_bytes", "")
        if self.era.graphs_inside is not True or self.estimate_not_applied():
            return pool, "the CUDA graph pool outside the budget ({})".format(src)
        if w.cuda_graph_estimate_bytes is None:
            return 0, ""
        beyond = pool - w.cuda_graph_estimate_bytes
        if beyond <= PRINT_TOLERANCE_BYTES:
            return 0, ""
        return beyond, "the CUDA graph pool beyond its estimate ({}; the estimate is inside the budget)".format(
            w.sources.get("cuda_graph_estimate_bytes", src))

    def graphs_outside_budget(self) -> bool:
        """Whether the rules say CUDA graphs come on top of T·u: before 0.20.0, or 0.20+ with the estimate not
        applied; an era the lines leave open is read as inside (the rules then claim nothing about graphs)."""
        return self.era.graphs_inside is False or self.estimate_not_applied()

    def estimate_not_applied(self) -> bool:
        """0.20+ with the graph estimate left out of the budget: Model Runner V2 before 0.29, or
        VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 (gpu_worker.py determine_available_memory subtracts the
        estimate only with the variable set and otherwise warns 'CUDA graph memory profiling is disabled';
        read in the 0.27.0 wheel): the whole pool then comes on top of the budget, as before 0.20."""
        return self.mrv2_without_estimate() or any(e.kind == "graph_advisory" and e.data.get("disabled")
                                                   for e in self.events)

    def mrv2_without_estimate(self) -> bool:
        """Model Runner V2 before 0.29: its weights line lacks 'memory' and prints format_gib, not %.4f
        ('Model loading took %s GiB and', v1/worker/gpu/model_runner.py load_model, 0.22.0–0.27.x; the word
        comes in 0.28.0), or gpu_worker.py init_device's INFO 'Using V2 Model Runner' (0.27.0: the one sign in
        0.28); its graph estimate is 0 until 0.29.0 (profile_cudagraph_memory)."""
        if self.era.since is not None and self.era.since >= (0, 29, 0):
            return False
        for ev in self.events:
            if ev.kind == "model_runner_v2":
                return True
            if ev.kind == "weights" and _MRV2_WEIGHTS.search(ev.text or ""):
                return True
        return False

    def _nccl_note(self) -> str:
        """From 0.11.0 NCCL and custom all-reduce buffers sit outside the budget (gpu_worker.py init_device takes
        the snapshot after NCCL init) and no line prints them: with more than one GPU the room is an upper bound."""
        tp = _given(self.server_args, "tensor_parallel_size") or 1
        pp = _given(self.server_args, "pipeline_parallel_size") or 1
        multi = tp * pp > 1 or len(self.ranks) > 1
        after_nccl = self.era.until is None or self.era.until >= (0, 11, 0)
        return "; NCCL and all-reduce buffers, which no line prints, not taken off: an upper bound" \
            if multi and after_nccl else ""

    def sized_worker(self) -> Optional[Worker]:
        """The first worker that printed the device total and the fraction (what a new u is sized from)."""
        return next((w for w in self.ranks if w.total_gpu_bytes and w.gpu_memory_utilization is not None), None)

    def utilization_for(self, delta_bytes: int, cuda_total: Optional[int] = None,
                        flags: Optional[Dict[str, Any]] = None) -> Optional[Tuple[float, int]]:
        """(new --gpu-memory-utilization, bytes it moves per worker) for a budget move of about
        ``delta_bytes``: u + delta/T rounded down to 0.01 (so a raise never takes more than the spare, and a
        cut gives back at least the shortfall). In every era the budget is T·u, so the KV memory moves by
        the budget's move (0.20+ graphs sit inside it, still a constant). u is ``fraction``'s; T is NVML's
        ``cuda_total`` on a live node, else the log's. None when the value would leave (0, 1), or when a cut
        would leave no KV cache (``why_no_kv_change`` says why)."""
        got = self.fraction(flags or {})
        w = self.sized_worker()
        total = cuda_total or (w.total_gpu_bytes if w is not None else None)
        if got is None or not total or not delta_bytes:
            return None
        u = got[0]
        new = math.floor((u + delta_bytes / total) * 100 + 1e-9) / 100
        if not 0 < new < 1:
            return None
        gain = int(round((new - u) * total))
        kv = self.binding()
        if gain < 0 and kv is not None and kv.available_kv_bytes is not None and -gain >= kv.available_kv_bytes:
            return None
        return (new, gain) if gain else None

    def kv_capacity(self) -> Optional[Tuple[int, int, str]]:
        """(KV tokens, KV bytes, how): what the binding worker's KV memory holds in vLLM's own token count,
        so a budget move of N bytes is N × tokens ÷ bytes tokens. V1 prints the tokens ('GPU KV cache size',
        kv_cache_utils.py: blocks × block size, from 0.21 concurrency × max_model_len, both in proportion to
        the blocks); V0 prints blocks, whose block size its concurrency line implies (executor_base.py
        initialize_cache: blocks × block_size ÷ max_model_len, printed %.2f). None without the figures, or
        when num_gpu_blocks_override replaced the profiled count (then the tokens are not the KV memory's)."""
        w = self.binding()
        if w is None or not w.available_kv_bytes or w.available_kv_bytes <= 0:
            return None
        if any(e.kind == "blocks_override" for e in self.events):
            return None
        kv, src = w.available_kv_bytes, w.sources.get("available_kv_bytes", "")
        if self.kv_cache_tokens:
            tokens = self._tokens_of(w)
            if tokens is None:
                return None
            return tokens, kv, "GPU KV cache size {:,} tokens ({}) in {} of KV cache memory ({})".format(
                tokens, self.summary.source, gib(kv), src)
        size = self.implied_block_size()
        if size is None or not self.gpu_blocks:
            return None
        return self.gpu_blocks * size, kv, "{:,} GPU blocks × {} tokens per block (the size {}'s concurrency " \
            "implies) in {} of KV cache memory ({})".format(self.gpu_blocks, size, self.concurrency_source, gib(kv),
                                                           src)

    def _tokens_of(self, w: Worker) -> Optional[int]:
        """The KV tokens that go with worker ``w``'s KV memory: the binding report when the workers agree
        (0.12+ gives every worker the least block count, kv_cache_utils.py get_kv_cache_configs), else
        ``w``'s own report (before 0.12 each worker printed its own); None when ``w`` printed none."""
        own = {e.rank or "": e.data["tokens"] for e in self.events
               if e.kind == "kv_tokens" and e.data.get("tokens") is not None}
        if len(set(own.values())) <= 1:
            return self.kv_cache_tokens
        return own.get(w.rank)

    def implied_block_size(self) -> Optional[int]:
        """The one whole block size for which blocks × size ÷ max_model_len prints as the logged concurrency
        (V0 executor_base.py initialize_cache; V1 ≤ 0.8 kv_cache_utils.py, before the 'GPU KV cache size' line
        carried the tokens); None when the line is missing or two sizes fit its 0.01 print rounding."""
        c, blocks = self.max_concurrency, self.gpu_blocks
        if not c or not blocks or c.get("times") is None or not c.get("tokens_per_request"):
            return None
        lo = (c["times"] - 0.005) * c["tokens_per_request"] / blocks
        hi = (c["times"] + 0.005) * c["tokens_per_request"] / blocks
        sizes = range(max(1, math.ceil(lo - 1e-9)), math.floor(hi + 1e-9) + 1)
        return sizes[0] if len(sizes) == 1 else None

    def kv_tokens_for(self, gain_bytes: int) -> Optional[int]:
        """The KV tokens a budget move of ``gain_bytes`` per worker adds (negative: removes), rounded toward 0."""
        cap = self.kv_capacity()
        if cap is None:
            return None
        tokens, kv, _ = cap
        return gain_bytes * tokens // kv if gain_bytes >= 0 else -((-gain_bytes * tokens) // kv)

    def kv_change(self, delta_bytes: int, cuda_total: Optional[int] = None,
                  flags: Optional[Dict[str, Any]] = None) -> Optional[KvChange]:
        """The protocol's flag change for a KV budget move (``utilization_for``, with NVML's CUDA total and
        the running server's flags on a live node), in tokens where the log gives them (``kv_capacity``)."""
        moved = self.utilization_for(delta_bytes, cuda_total, flags)
        if moved is None:
            return None
        new, gain = moved
        tokens = self.kv_tokens_for(gain)
        if tokens is None:
            return None
        return KvChange(flag="--gpu-memory-utilization", value="{:.2f}".format(new), gain_bytes=gain,
                        gain_tokens=tokens, rounding=UTILIZATION_ROUNDING)

    def why_no_kv_change(self, delta_bytes: int, live: bool, cuda_total: Optional[int] = None,
                         flags: Optional[Dict[str, Any]] = None) -> Tuple[str, str]:
        """(why, action) when no --gpu-memory-utilization moves the budget by ``delta_bytes``; ("", "") when
        one does (also when only its tokens are unknown: the change is still advised, in bytes)."""
        if self.utilization_for(delta_bytes, cuda_total, flags) is not None:
            return "", ""
        flag, margin = "--gpu-memory-utilization", self.options.margin_bytes
        w = self.sized_worker()
        total = cuda_total or (w.total_gpu_bytes if w is not None else None)
        if delta_bytes < 0 and total and margin >= total:
            return ("no {} keeps the {} margin: it is more than the GPU's {} total".format(flag, gib(margin),
                                                                                        gib(total)),
                    "none: the {} margin exceeds the GPU ({} total); check --margin".format(gib(margin), gib(total)))
        if total and self.fraction(flags or {}) is not None:
            return self._why_no_cut(delta_bytes) if delta_bytes < 0 else ("", "")  # a raise under the 0.01 step
        if self.fixed_kv_size(flags or {}):
            return ("--kv-cache-memory-bytes sets the KV cache, so {} sizes nothing".format(flag),
                    "none from this log: --kv-cache-memory-bytes sets the KV cache, not {}".format(flag))
        paste = "pass the whole startup with --log" if live else \
            "paste the startup up to 'init engine … took' or the API server's ready line, or run `kvforensics inspect`"
        return ("this log cannot size {} (it prints no {})".format(
                    "a {} raise".format(flag) if delta_bytes > 0 else "a lower " + flag,
                    "gpu_memory_utilization" if total else "device total"),
                "this log cannot size {}: {}".format("a raise" if delta_bytes > 0 else "a cut", paste))

    def _why_no_cut(self, delta_bytes: int) -> Tuple[str, str]:
        """A cut ``utilization_for`` refused: below 0, or at least the whole KV cache."""
        kv = self.binding()
        if kv is None or not kv.available_kv_bytes:
            return "", ""
        flag, margin = "--gpu-memory-utilization", self.options.margin_bytes
        return ("no {} keeps the {} margin: giving back {} would leave no KV cache (it is {})".format(
                    flag, gib(margin), gib(-delta_bytes), gib(kv.available_kv_bytes)),
                "none: no {} keeps a {} margin and a KV cache; use more GPUs (--tensor-parallel-size) or check "
                "--margin".format(flag, gib(margin)))

    def headroom(self) -> Tuple[Optional[int], str]:
        """Memory no budget covers after a finished startup, the least worker's: free at startup − the
        budget − graphs outside it where the log prints free at startup (``_outside_at_start``); else
        T − T·u − graphs outside − the CUDA context (not in the log: the figure measured on a real GPU,
        CUDA_CONTEXT_BYTES), except in 0.6.4.x and V1 ≤ 0.9.0, whose device-wide non-torch figure already
        holds the context inside T·u (worker.py determine_num_available_blocks, 0.6.4.post1). Only from a
        complete startup whose worker printed T and u."""
        if not self.complete or self.failure is not None:
            return None, ""
        graphs, graphs_how = self.graphs_outside()
        best: Optional[Tuple[int, str]] = None
        for w in self.ranks:
            if w.total_gpu_bytes is None or w.requested_bytes is None:
                continue
            free, how = self._room_of(w, graphs, graphs_how.replace("outside the budget", "outside it"))
            if best is None or free < best[0]:
                best = (free, how)
        return best if best is not None else (None, "")

    def _room_of(self, w: Worker, graphs: int, graphs_how: str) -> Tuple[int, str]:
        """(free at startup or T, less the budget, the graphs outside it and what else no budget covers; how)."""
        assert w.total_gpu_bytes is not None and w.requested_bytes is not None
        how = "the budget ({})".format(w.sources.get("requested_bytes", "")) + (" − " + graphs_how if graphs else "")
        if w.free_at_start_bytes is not None:
            return w.free_at_start_bytes - w.requested_bytes - graphs, "free at startup ({}) − {}".format(
                w.sources.get("free_at_start_bytes", ""), how)
        room = w.total_gpu_bytes - w.requested_bytes - graphs
        if self.era.name in ("V0-b", "V1-a"):
            return room, "total_gpu_memory − {} (the CUDA context and other processes are inside the budget in " \
                "this era)".format(how)
        return room - CUDA_CONTEXT_BYTES, "total_gpu_memory − {} − the CUDA context (~{} MiB, not in the log: " \
            "measured on an H200){}".format(how, CUDA_CONTEXT_BYTES >> 20, self._nccl_note())

    def engine_warnings(self, kind: str) -> List[Tuple[str, str]]:
        return []


# --- building ------------------------------------------------------------------------------

_WORKER_FIELDS = {
    "total_bytes": "total_gpu_bytes", "utilization": "gpu_memory_utilization", "requested_bytes": "requested_bytes",
    "weights_bytes": "weights_bytes", "non_torch_bytes": "non_torch_bytes", "activation_bytes": "activation_peak_bytes",
    "graph_bytes": "cuda_graph_bytes", "estimate_bytes": "cuda_graph_estimate_bytes",
    "available_kv_bytes": "available_kv_bytes", "free_bytes": "free_at_start_bytes",
    "initial_bytes": "initial_usage_bytes", "peak_torch_bytes": "peak_torch_bytes",
    "post_profile_bytes": "post_profile_usage_bytes",
}
_WORKER_KINDS = ("weights", "budget", "breakdown", "global_profile", "available_kv", "graph_end", "graph_estimate",
                 "graph_pool", "graph_advisory", "suggestion")
_MRV2_WEIGHTS = re.compile(r"Model loading took (?!\d+\.\d{4} )\S+ GiB and ")
_FREE_CHECK_FMTS = ("free_short", "maxlen_v1")  # failures that print the device's memory figures
_UNSPECIFIC_CAUSES = GENERIC_CAUSES + ("cuda_out_of_memory",)
_CONFIG_ARGS = ("max_model_len", "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size")


def _workers(events: Tuple[LogEvent, ...]) -> Tuple[Worker, ...]:
    """One Worker per process prefix, in the order the log first names them."""
    per: Dict[str, Dict[str, Any]] = {}
    for ev in events:
        if not _prints_worker_memory(ev):
            continue
        w = per.setdefault(ev.rank or "", {"sources": {}})
        _take_figures(ev, w)
        _take_profile_figures(ev, w)
    return tuple(Worker(rank=r, **fields) for r, fields in per.items())


def _prints_worker_memory(ev: LogEvent) -> bool:
    return ev.kind in _WORKER_KINDS or (ev.kind == "failure" and ev.fmt in _FREE_CHECK_FMTS)


def _take_figures(ev: LogEvent, w: Dict[str, Any]) -> None:
    """The line's figures that are Worker fields, each cited with the line and the message it came from."""
    for key, value in ev.data.items():
        name = _WORKER_FIELDS.get(key)
        if name is None or value is None or _keeps_own_weights(ev, key, name, w):
            continue
        w[name] = value
        w["sources"][name] = "{} ({})".format(where(ev), ev.data.get("header") or ev.fmt)


def _keeps_own_weights(ev: LogEvent, key: str, name: str, w: Dict[str, Any]) -> bool:
    """Whether the worker keeps the weights figure it has (or will get) over this line's."""
    if ev.kind == "breakdown" and key == "weights_bytes":
        return True  # a profiling breakdown's weights come in through _take_profile_figures, last
    # the weights line's 4 decimals beat a profiling message's 2
    return name == "weights_bytes" and ev.kind != "weights" and "weights_bytes" in w


def _take_profile_figures(ev: LogEvent, w: Dict[str, Any]) -> None:
    """The figures a profiling line gives under other names than the Worker fields'."""
    if ev.kind == "breakdown" and "weights_bytes" not in w:
        w["weights_bytes"] = ev.data["profile_weights_bytes"]
        w["sources"]["weights_bytes"] = where(ev)
    if ev.kind == "global_profile":
        d = ev.data
        w["requested_bytes"] = int(d["total_bytes"] * d["utilization"])
        w["activation_peak_bytes"] = d["peak_torch_bytes"]  # torch peak, weights included (0.6.4.x)
        w["sources"]["requested_bytes"] = "total_gpu_memory × gpu_memory_utilization ({})".format(where(ev))


def _era(events: Tuple[LogEvent, ...]) -> Era:
    since, until, clues = _release_bounds(events)
    family = _family(events)
    names = [n for n, lo, hi, _ in ERAS if (family is None or n.startswith(family))
             and (since is None or hi >= since) and (until is None or lo <= until)]
    inside = {g for n, lo, hi, g in ERAS if n in names}
    return Era(family=family, since=since, until=until, name=names[0] if len(names) == 1 else None,
               graphs_inside=inside.pop() if len(inside) == 1 else None, clues=tuple(dict.fromkeys(clues)))


def _family(events: Tuple[LogEvent, ...]) -> Optional[str]:
    """V1 or V0 when only that engine generation's lines are in the log; None with both or neither."""
    v1 = any(_v1_line(e) for e in events)
    v0 = any(_v0_line(e) for e in events)
    if v1 == v0:
        return None
    return "V1" if v1 else "V0"


def _v1_line(ev: LogEvent) -> bool:
    # "VllmWorker TP0" (with a blank) is V1's multiproc worker in 0.10.x (v0.10.1.1
    # v1/executor/multiproc_executor.py WorkerProc.__init__); V0's is "VllmWorkerProcess".
    return (ev.kind in _V1_KINDS or ev.fmt in _V1_FMTS
            or (ev.rank or "").startswith(("EngineCore", "Worker_", "VllmWorker "))
            or (_is_banner(ev) and bool(ev.data.get("v1"))))


def _v0_line(ev: LogEvent) -> bool:
    # Only V0 prints CPU (swap) blocks next to the GPU blocks.
    return (ev.fmt in _V0_FMTS or (ev.kind == "blocks" and ev.data.get("cpu_blocks") is not None)
            or (ev.rank or "").startswith("VllmWorkerProcess"))


def _is_banner(ev: LogEvent) -> bool:
    """The engine's banner line with its version."""
    return ev.kind == "engine_config" and bool(ev.data.get("version"))


def _release_bounds(events: Tuple[LogEvent, ...]) -> Tuple[Optional[Version], Optional[Version], List[str]]:
    """(since, until, clues): the narrowest release range the lines allow, and why, in log order."""
    since: Optional[Version] = None
    until: Optional[Version] = None
    clues: List[str] = []
    for ev in events:
        if _is_banner(ev):
            clues.append("{}: engine banner v{}".format(where(ev), ev.data["version"]))
            since, until = _banner_bounds(ev.data["version"], since, until)
        for lo, hi, why in _format_clues(ev):
            since, until = _narrowed(since, until, lo, hi)
            clues.append("{}: {}".format(where(ev), why))
    return since, until, clues


def _format_clues(ev: LogEvent) -> List[Tuple[Optional[Version], Optional[Version], str]]:
    """(since, until, why) for each release clue the line's format finds in it."""
    row = BY_NAME.get(ev.fmt)
    found = [clue(ev.data, ev.text) for clue in row.clues] if row else []
    return [f for f in found if f is not None]


def _narrowed(since: Optional[Version], until: Optional[Version], lo: Optional[Version],
              hi: Optional[Version]) -> Tuple[Optional[Version], Optional[Version]]:
    """The range [since, until] cut down to [lo, hi] (None: no bound on that side)."""
    if lo is not None and (since is None or lo > since):
        since = lo
    if hi is not None and (until is None or hi < until):
        until = hi
    return since, until


def _banner_bounds(text: str, since: Optional[Version], until: Optional[Version]) -> Tuple[Optional[Version],
                                                                                          Optional[Version]]:
    """The banner's own version narrows the era: a release ("0.11.0", "0.6.4.post1") pins it; a
    pre-release or build of the main branch ("0.12.0.dev5+g…", "0.11.0rc2") is only no later."""
    m = re.match(r"(\d{1,4})\.(\d{1,4})\.(\d{1,4})(\.post\d+)?(.*)$", text)
    if m is None:
        return since, until
    v = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    if not m.group(5):
        since = v if since is None or v > since else since
    until = v if until is None or v < until else until
    return since, until


def _order(ev: LogEvent) -> Tuple[int, int]:
    return (ev.offset, ev.line or 0)


def _failure(events: Tuple[LogEvent, ...], workers: Tuple[Worker, ...], stages: List[str],
             last: Optional[LogEvent]) -> Optional[Failure]:
    failures = [e for e in events if e.kind == "failure"]
    exceptions = [e for e in events if e.kind == "exception"]
    if not failures and not exceptions:
        return None
    primary = _primary_failure(failures, exceptions)
    cause = str(primary.data.get("cause", "exception"))
    message = _failure_message(primary, cause, exceptions)
    no_kv = _no_kv_memory(cause, workers, primary, message)
    if no_kv is not None:
        return no_kv
    stage, how = _failed_stage(cause, events, stages, last)
    return Failure(cause=cause, stage=stage, stage_source=how,
                   message=message if len(message) <= 300 else message[:297] + "...",
                   rank=primary.rank or None, event=primary)


def _primary_failure(failures: List[LogEvent], exceptions: List[LogEvent]) -> LogEvent:
    """The line that explains the others: a specific cause, else a CUDA OOM, else the most telling
    generic one (GENERIC_CAUSES' order), else the first exception."""
    specific = [e for e in failures if e.data.get("cause") not in _UNSPECIFIC_CAUSES]
    oom = [e for e in failures if e.data.get("cause") == "cuda_out_of_memory"]
    generic = sorted((e for e in failures if e.data.get("cause") in GENERIC_CAUSES),
                     key=lambda e: GENERIC_CAUSES.index(str(e.data.get("cause"))))
    return (specific or oom or generic or exceptions)[0]


def _failure_message(primary: LogEvent, cause: str, exceptions: List[LogEvent]) -> str:
    """A generic failure ('Engine core initialization failed') says little: the first exception with
    text at or after it says what went wrong."""
    if primary.kind == "exception" or cause not in GENERIC_CAUSES:
        return primary.text
    said = next((e for e in exceptions if _order(e) >= _order(primary) and e.data.get("text")), None)
    return said.text if said is not None else primary.text


def _no_kv_memory(cause: str, workers: Tuple[Worker, ...], primary: LogEvent, message: str) -> Optional[Failure]:
    """A generic failure after a worker's KV figure came out ≤ 0 is vLLM's 'No available memory for
    the cache blocks' (its message is not always in the log)."""
    kv = [w.available_kv_bytes for w in workers if w.available_kv_bytes is not None]
    if cause not in GENERIC_CAUSES or not kv or min(kv) > 0:
        return None
    return Failure(cause="no_kv_memory", stage="kv_cache",
                   stage_source="the KV figure before it ({} GiB): vLLM raises 'No available memory for the cache "
                   "blocks'".format(round(min(kv) / 2**30, 2)), message=message, rank=primary.rank or None,
                   event=primary)


def _failed_stage(cause: str, events: Tuple[LogEvent, ...], stages: List[str],
                  last: Optional[LogEvent]) -> Tuple[str, str]:
    """(the stage the startup died in, how that is known), from the surest sign to the weakest."""
    if cause in _CAUSE_STAGE:
        return _CAUSE_STAGE[cause], "the message"
    frame_stage = _frame_stage(events)
    if frame_stage is not None:
        return frame_stage, "traceback frames"
    if "graph_capture" in stages and not any(e.kind == "graph_end" for e in events):
        return "graph_capture", "a CUDA graph capture began and never finished"
    if last is None:
        return "unknown", "nothing in the log shows how far it got"
    if not stages:
        return "unknown", "the last stage the log shows (none, {})".format(where(last))
    if last.kind == "available_kv" and (last.rank or "").startswith(("EngineCore", "Worker")):
        # V1: the engine core checks the KV config against the model (v1/core/kv_cache_utils.py
        # get_kv_cache_configs, 0.11–0.31) before it logs 'GPU KV cache size': dying right after the
        # worker's KV figure is dying in KV planning, not in a graph capture no line shows.
        return "kv_cache", "the KV figure ({}) with no 'KV cache size' line after it".format(where(last))
    # It died in the stage after the last one the log shows; the latest a startup can die in is graph capture.
    i = STAGES.index(stages[-1])
    return STAGES[min(i + 1, len(STAGES) - 2)], "the last stage the log shows ({}, {})".format(stages[-1], where(last))


def _frame_stage(events: Tuple[LogEvent, ...]) -> Optional[str]:
    """The stage of the innermost traceback frame that names a function _FRAME_STAGE knows."""
    stage = None
    for ev in events:
        if ev.kind == "frame":
            stage = _stage_of_function(ev.data.get("func")) or stage
    return stage


def _stage_of_function(func: Any) -> Optional[str]:
    found = None
    for funcs, name in _FRAME_STAGE:
        if func in funcs:
            found = name
    return found


def _outside_at_start(w: Optional[Worker]) -> Optional[Tuple[int, str]]:
    """(T − free at startup, how): what no budget covers, exact, where the worker printed 'Free memory on device
    (free/total GiB) on startup' (gpu_worker.py determine_available_memory, INFO from 0.27.1): the CUDA context,
    NCCL and custom all-reduce buffers and what other processes held before startup (from 0.27 a co-tenant's
    growth during profiling is inside the budget, utils/mem_utils.py memory_profiling)."""
    if w is None or w.free_at_start_bytes is None or w.total_gpu_bytes is None:
        return None
    return w.total_gpu_bytes - w.free_at_start_bytes, "what was in use at startup ({}: the CUDA context, NCCL, " \
        "other processes)".format(w.sources.get("free_at_start_bytes", ""))


def _given(flags: Dict[str, Any], key: str) -> Optional[float]:
    """A positive number a server's settings give for ``key`` (bool, text, NaN and junk are not)."""
    value = flags.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e15:
        return None
    return None if key == "gpu_memory_utilization" and value > 1 else float(value)


def _geometry(cfg: Optional[Dict[str, Any]], args: Dict[str, Any],
              era: Era) -> Tuple[Optional[KvGeometry], Optional[str]]:
    if not cfg:
        return None, None

    def size(key: str) -> int:
        value = args.get(key)
        return value if isinstance(value, int) and 0 < value <= 4096 else 1

    try:
        reads = True if era.since and era.since >= (0, 14, 0) else (
            False if era.until and era.until < (0, 14, 0) else None)
        return kv_geometry.geometry(cfg, size("tensor_parallel_size"), args.get("kv_cache_dtype"),
                                    size("pipeline_parallel_size"), reads), None
    except GeometryError as exc:
        return None, str(exc)


def build_analysis(startup: Startup, target: str, opts: Options, index: Optional[int] = None,
                   count: Optional[int] = None, reader_notes: Tuple[str, ...] = (),
                   fallback_args: Optional[Dict[str, Any]] = None) -> Analysis:
    """``fallback_args``: the live server's command-line flags, for what the log does not print."""
    events = startup.events
    workers = _workers(events)
    era = _era(events)
    args, arg_problems = _server_args(events, fallback_args)
    tokens_evs = [e for e in events if e.kind == "kv_tokens" and e.data.get("tokens") is not None]
    reports = tuple(e.data["tokens"] for e in tokens_evs)
    tokens = min(reports) if reports else None
    gpu_blocks, cpu_blocks = _blocks(events)
    conc_ev, conc = _concurrency(events, tokens_evs)
    maxlen = _max_model_len(events, args, conc)
    stages, last = _stages(events)
    complete, died = _outcome(startup, workers, stages, last)
    geo, geo_note = _geometry(opts.model_config, args, era)
    return Analysis(
        target=target, status="ok" if complete or died is not None else "partial",
        problems=_problems(reader_notes, complete, died, stages, workers, era) + arg_problems, era=era,
        server_args=args,
        startup_index=index, startup_count=count, startup_first_line=startup.first_line, ranks=workers,
        kv_cache_tokens=tokens, kv_cache_reports=reports, gpu_blocks=gpu_blocks, cpu_blocks=cpu_blocks,
        max_model_len=maxlen, kv_cache_dtype=args.get("kv_cache_dtype"), max_concurrency=conc,
        concurrency_source=where(conc_ev) if conc_ev else "", checks=tuple(_checks(workers, events, era)),
        stages_seen=tuple(stages), last_event=last, complete=complete, failure=died, options=opts, events=events,
        budget=Budget(cell_bytes=_cell_bytes(workers, tokens, era)), geometry=geo, geometry_note=geo_note,
        # The shared protocol's pool and length: the binding KV report and max_model_len (vLLM prints
        # no request-slot count; --max-num-seqs is a flag, not a log line).
        summary=Summary(max_total_num_tokens=tokens, max_running_requests=None, context_len=maxlen,
                        source=where(tokens_evs[reports.index(tokens)]) if tokens is not None else ""))


# The flags the model and the reports read, typed first (agent/model/flags.py): a forged or corrupted
# value (a string max_model_len in a bundle) is unknown with a problem, not a crash.
FLAGS = {
    "max_model_len": flags.count(1), "tensor_parallel_size": flags.count(1, 1 << 16),
    "pipeline_parallel_size": flags.count(1, 1 << 16), "gpu_memory_utilization": flags.number(0, 1),
    "kv_cache_dtype": flags.TEXT, "model": flags.TEXT, "model_path": flags.TEXT,
}


def _server_args(events: Tuple[LogEvent, ...],
                 fallback_args: Optional[Dict[str, Any]]) -> Tuple[Dict[str, Any], Tuple[Problem, ...]]:
    """The engine's arguments as the log prints them (the args line, the banner, the KV dtype line),
    then the live server's flags for the ones it does not; each typed (FLAGS), with the problems of
    the values that were not."""
    args: Dict[str, Any] = {}
    problems: List[Problem] = []
    for at, ev in enumerate(events):
        if ev.kind == "args":
            logged, dropped = flags.typed(_joined_args(events, at), FLAGS, "the log's arguments ({})".format(where(ev)))
            args.update(logged)
            problems.extend(dropped)
        elif ev.kind == "engine_config":
            args.update({k: ev.data[k] for k in _CONFIG_ARGS if ev.data.get(k) is not None})
        elif ev.kind == "kv_dtype":
            args.setdefault("kv_cache_dtype", ev.data["kv_cache_dtype"])
    given, dropped = flags.typed(fallback_args or {}, FLAGS, "the server's command line")
    problems.extend(dropped)
    for key, value in given.items():
        args.setdefault(key, value)
    return args, tuple(problems)


def _joined_args(events: Tuple[LogEvent, ...], at: int) -> Dict[str, Any]:
    """The arguments of the args line ``events[at]``; when a console hard-wrapped its dict, with the
    header-less lines right after it (args_tail, no process prefix, consecutive line numbers) joined
    back as printed, so a value cut by the wrap still reads; an item cut at the end of what was
    found is left out, not misread."""
    ev = events[at]
    if not ev.data.get("open") or ev.line is None:
        return ev.data["args"]
    raw = ev.raw.rstrip("\r\n")
    text, line = raw[raw.find("non-default args: {"):], ev.line
    for tail in events[at + 1:]:
        if tail.kind != "args_tail" or tail.rank is not None or tail.line != line + 1:
            break
        text, line = text + tail.raw.rstrip("\r\n"), tail.line
        if text.endswith("}"):
            break
    return arg_values(whole_items(text)) if line != ev.line else ev.data["args"]


def _blocks(events: Tuple[LogEvent, ...]) -> Tuple[Optional[int], Optional[int]]:
    """(GPU blocks, CPU blocks) of the first blocks line; V1 prints no CPU blocks."""
    ev = next((e for e in events if e.kind == "blocks"), None)
    if ev is None:
        return None, None
    return ev.data["gpu_blocks"], ev.data.get("cpu_blocks")


def _concurrency(events: Tuple[LogEvent, ...],
                 tokens_evs: List[LogEvent]) -> Tuple[Optional[LogEvent], Optional[Dict[str, Any]]]:
    """(the line, its figures) of the binding 'Maximum concurrency', on its own line or inside a KV
    tokens line. Before 0.12 every worker prints its own line; vLLM then gives every worker the
    smallest block count (kv_cache_utils.py get_kv_cache_configs / unify_kv_cache_configs), so the
    least binds."""
    conc_evs = [e for e in events if e.kind == "concurrency" and e.data and e.data.get("times") is not None]
    conc_ev = min(conc_evs, key=lambda e: e.data["times"], default=None)
    if conc_ev is not None:
        conc = dict(conc_ev.data)
    else:
        conc_ev = next((e for e in tokens_evs if e.data.get("concurrency")), None)
        if conc_ev is None:
            return None, None
        conc = dict(conc_ev.data["concurrency"])
    conc.pop("header", None)
    conc.pop("repeated", None)
    return conc_ev, conc


def _max_model_len(events: Tuple[LogEvent, ...], args: Dict[str, Any],
                   conc: Optional[Dict[str, Any]]) -> Optional[int]:
    """The length a 'max_model_len too large' failure refused, else the arguments', else the
    concurrency line's tokens per request."""
    logged = args.get("max_model_len") or (conc["tokens_per_request"] if conc else None)
    refused = next((e.data["max_model_len"] for e in events if e.kind == "failure"
                    and e.data.get("cause") == "max_model_len_too_large"), None)
    return refused or logged


def _stages(events: Tuple[LogEvent, ...]) -> Tuple[List[str], Optional[LogEvent]]:
    """The startup stages the log shows, in the order first seen, and the last line that shows one."""
    stages: List[str] = []
    last: Optional[LogEvent] = None
    for ev in events:
        st = _STAGE_OF_KIND.get(ev.kind)
        if st is None:
            continue
        if st not in stages:
            stages.append(st)
        last = ev
    return stages, last


def _outcome(startup: Startup, workers: Tuple[Worker, ...], stages: List[str],
             last: Optional[LogEvent]) -> Tuple[bool, Optional[Failure]]:
    """(complete, the failure): a closed startup without failure lines that reached 'ready' needs no
    failure analysis; any failure found makes the startup incomplete."""
    events = _before_ready(startup.events)  # what it printed once ready is serving, not its startup
    complete = startup.closed and not any(e.kind in ("failure", "exception") for e in events)
    if complete and "ready" in stages:
        return complete, None
    died = _failure(events, workers, stages, last)
    return complete and died is None, died


def ready_event(events: Tuple[LogEvent, ...]) -> Optional[LogEvent]:
    """The first line that shows the engine ready (its init done, the API server serving)."""
    return next((e for e in events if _STAGE_OF_KIND.get(e.kind) == "ready"), None)


def _before_ready(events: Tuple[LogEvent, ...]) -> Tuple[LogEvent, ...]:
    """The startup's own lines: a request's error after 'Application startup complete.' ("This model's maximum
    context length is 2048 tokens", a client gone) is a serving problem, never the startup's failure."""
    ready = ready_event(events)
    return events if ready is None else tuple(e for e in events if _order(e) <= _order(ready))


def _cell_bytes(workers: Tuple[Worker, ...], tokens: Optional[int], era: Era) -> Optional[int]:
    """KV bytes per token: the binding worker's KV memory ÷ the binding KV report; only before 0.21
    (from 0.21 the token figure is concurrency × max_model_len, not the blocks' tokens)."""
    kv = [w.available_kv_bytes for w in workers if w.available_kv_bytes is not None]
    if not tokens or not kv or min(kv) <= 0 or (era.since and era.since >= (0, 21, 0)):
        return None
    cell = int(min(kv) / tokens)
    return cell if cell >= 1 else None  # more tokens than bytes (a forged figure): unknown, never 0


def _problems(reader_notes: Tuple[str, ...], complete: bool, died: Optional[Failure], stages: List[str],
              workers: Tuple[Worker, ...], era: Era) -> Tuple[Problem, ...]:
    problems: List[Problem] = [Problem("log.reader", note) for note in reader_notes]
    if not complete and died is None:
        problems.append(Problem("log.fragment", "the log stops before the engine finished starting (last stage: {})"
                                .format(STAGE_WORDS.get(stages[-1], "none") if stages else "none")))
    if not workers:
        problems.append(Problem("log.no_ranks", "no per-worker memory lines in this startup"))
    if era.conflicting:
        problems.append(Problem("log.version_conflict", "the log's release clues contradict each other ({}; "
                                "engine.version_clues lists them): lines of two releases in one startup, or an "
                                "edited log; the era is left open".format(era.hint)))
    return tuple(problems)


def _checks(workers: Tuple[Worker, ...], events: Tuple[LogEvent, ...], era: Era) -> List[KvCheck]:
    out: List[KvCheck] = []
    for ev in events:
        d = ev.data
        rank = ev.rank or ""
        if ev.kind == "breakdown":
            budget = next((e for e in events if e.kind == "budget" and (e.rank or "") == rank), None)
            if budget is None:
                continue
            pred = budget.data["requested_bytes"] - d["profile_weights_bytes"] - d["non_torch_bytes"] \
                - d["activation_bytes"]
            out.append(KvCheck(rank=rank, formula="total_gpu_memory × gpu_memory_utilization − weights − non_torch − "
                             "activation peak (vLLM 0.6.5–0.10.2 worker.py determine_num_available_blocks)",
                             predicted_bytes=pred, logged_bytes=d["available_kv_bytes"],
                             tolerance_bytes=4 * PRINT_TOLERANCE_BYTES, evidence=(where(budget), where(ev))))
        elif ev.kind == "global_profile":
            pred = int(d["total_bytes"] * d["utilization"]) - d["peak_torch_bytes"] - d["non_torch_bytes"]
            out.append(KvCheck(rank=rank, formula="total_gpu_memory × gpu_memory_utilization − peak_torch − non_torch "
                             "(vLLM 0.6.4.x worker.py determine_num_available_blocks)", predicted_bytes=pred,
                             logged_bytes=d["available_kv_bytes"], tolerance_bytes=4 * PRINT_TOLERANCE_BYTES,
                             evidence=(where(ev),)))
        elif ev.kind == "suggestion" and d.get("consumed_bytes") is not None and d.get("activation_bytes") is not None:
            pred = d["requested_bytes"] - d["consumed_bytes"] - d["activation_bytes"]
            out.append(KvCheck(rank=rank, formula="requested − consumed (weights + non-torch) − peak activation (with "
                             "the CUDA graph estimate) (vLLM 0.27+ gpu_worker.py determine_available_memory)",
                             predicted_bytes=pred, logged_bytes=d.get("available_kv_bytes"),
                             tolerance_bytes=4 * PRINT_TOLERANCE_BYTES, evidence=(where(ev),)))
    return out
