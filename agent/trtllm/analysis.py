"""One TensorRT-LLM startup's analysis: per-rank figures, the KV passes, the era's budget formula, the failure.

Pure: no I/O. What ``free_gpu_memory_fraction`` (F) is a share of, by era (read in TensorRT-LLM's source;
docs/engines/trtllm.md cites each rule):

* C++ eras (GptSession 0.5–0.9, the executor 0.10+, and the C++ KV manager under the PyTorch backend):
  ``KV = F × available``, where available is the memory free when the pool is sized (cudaMemGetInfo free
  + the runtime pool's free bytes), after the engine, its execution context and the runtime buffers
  (batch_manager/kvCacheManager.cpp ``KVCacheManager::calculateMaxNumBlocks``, 0.10–0.19;
  ``BaseKVCacheManager::calculateFreeMemBytes``, 0.20+), logged as ``Memory usage when calculating max
  tokens in paged kv cache: total: T GiB, available: A GiB``. Every rank then takes the smallest count
  (an MPI allreduce MIN).
* PyTorch backend (trtllm-serve / the LLM API, 0.17+): the model runs once with a temporary KV pool, then
  ``KV = F × (total − profiled peak + the temporary pool)`` (tensorrt_llm/_torch/pyexecutor/_util.py
  ``KvCacheCreator``, 1.0+: ``configure_kv_cache_capacity``), logged as ``Peak memory during memory usage
  profiling (torch + non-torch): P GiB, available KV cache memory when calculating max tokens: A GiB,
  fraction is set F, … device total memory T GiB, … tmp kv_mem X GiB``; the estimate becomes
  ``max_tokens`` and the KV manager allocates the real pool: the second ``Allocated`` line.

Neither is ``total × F``, as vLLM's and SGLang's budgets are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from kvforensics.agent.model import flags
from kvforensics.agent.model.citing import CitesEvent, where
from kvforensics.agent.model.records import Finding, KvChange, KvCheck, Options, Problem, Recommendation
from kvforensics.collectors.events import LogEvent
from kvforensics.collectors.trtllm.formats import PRINT_TOLERANCE_BYTES
from kvforensics.collectors.trtllm.startups import Startup
from kvforensics.collectors.units import gib

ENGINE = "trtllm"
DEFAULT_FRACTION = 0.9  # C++ KvCacheConfig::kDefaultGpuMemFraction; the LLM API's default (llm_args.py)
FRACTION_FLAG = "--kv_cache_free_gpu_memory_fraction"
TRITON_FRACTION = "kv_cache_free_gpu_mem_fraction"
FRACTION_ROUNDING = ("free_gpu_memory_fraction is rounded down to 0.01, so the pool grows by a little less than "
                     "the spare, never more")
STAGES = ("load", "profiling", "kv_cache", "ready")
STAGE_WORDS = {"load": "loading the model", "profiling": "the memory profiling run",
               "executor": "creating the executor",
               "kv_cache": "allocating the KV cache", "ready": "server ready", "unknown": "an unknown stage"}
_STAGE_OF_KIND = {"banner": "load", "backend": "load", "weights": "load", "engine": "load", "mpi": "load",
                  "after_weights": "profiling", "activation": "profiling", "outside_torch": "profiling",
                  "peak": "profiling", "estimate": "profiling", "mem_usage": "kv_cache", "allocated": "kv_cache",
                  "allocated_old": "kv_cache", "blocks": "kv_cache", "window_blocks": "kv_cache",
                  "tokens_per_block": "kv_cache", "runtime_sizes": "kv_cache", "torch_fraction": "ready",
                  "model_limit": "load",
                  "ready": "ready"}
_PYTORCH_KINDS = ("after_weights", "activation", "outside_torch", "peak", "estimate", "torch_fraction",
                  "max_tokens_set", "dry_run", "runtime_sizes")

# Rank fields, in the JSON contract's order (reports/trtllm/json_report.py).
RANK_FIELDS = ("weights_bytes", "kv_cache_bytes", "kv_tokens", "tokens_per_block", "primary_blocks",
               "secondary_blocks", "max_blocks_per_seq", "available_kv_bytes", "total_gpu_bytes",
               "free_gpu_memory_fraction", "peak_bytes", "estimated_kv_bytes", "temporary_kv_bytes",
               "torch_limit_bytes", "engine_size_bytes", "execution_context_bytes", "max_seq_len", "max_num_tokens",
               "max_batch_size", "kv_bytes_per_token", "free_before_failure_bytes", "available_bytes",
               "activation_bytes", "non_torch_bytes", "trt_managed_bytes", "max_num_requests",
               "max_attention_window", "max_beam_width", "weights_outside_torch_bytes", "torch_fraction")
# event data key → rank field (the last line of a rank wins: the final pass, not the temporary one)
_TAKE = {"weights_bytes": "weights_bytes", "kv_cache_bytes": "kv_cache_bytes", "kv_tokens": "kv_tokens",
         "tokens_per_block": "tokens_per_block", "primary_blocks": "primary_blocks",
         "secondary_blocks": "secondary_blocks", "max_blocks_per_seq": "max_blocks_per_seq",
         "available_kv_bytes": "available_kv_bytes", "total_bytes": "total_gpu_bytes",
         "peak_bytes": "peak_bytes", "estimated_kv_bytes": "estimated_kv_bytes",
         "temporary_kv_bytes": "temporary_kv_bytes", "torch_limit_bytes": "torch_limit_bytes",
         "engine_size_bytes": "engine_size_bytes", "execution_context_bytes": "execution_context_bytes",
         "max_seq_len": "max_seq_len", "max_num_tokens": "max_num_tokens", "max_batch_size": "max_batch_size",
         "kv_bytes_per_token": "kv_bytes_per_token", "available_bytes": "available_bytes",
         "activation_bytes": "activation_bytes", "non_torch_bytes": "non_torch_bytes",
         "trt_managed_bytes": "trt_managed_bytes", "max_num_requests": "max_num_requests",
         "max_attention_window": "max_attention_window", "max_beam_width": "max_beam_width",
         "outside_torch_after_weights_bytes": "weights_outside_torch_bytes", "torch_fraction": "torch_fraction"}
_FIGURE_KINDS = ("weights", "after_weights", "activation", "outside_torch", "peak", "estimate", "mem_usage",
                 "tokens_per_block", "allocated", "allocated_old", "blocks", "window_blocks", "runtime_sizes",
                 "torch_fraction", "engine", "seq_len_adjusted", "model_limit")


@dataclass(frozen=True)
class Rank:
    """One rank's memory as its lines print it (bytes; None = not in the log). ``rank`` is ``"RANK n"`` for the
    Python logger's tagged records, ``""`` for the C++ runtime's untagged ones (every rank prints them alike)."""

    rank: str
    weights_bytes: Optional[int] = None
    kv_cache_bytes: Optional[int] = None
    kv_tokens: Optional[int] = None
    tokens_per_block: Optional[int] = None
    primary_blocks: Optional[int] = None
    secondary_blocks: Optional[int] = None
    max_blocks_per_seq: Optional[int] = None
    available_kv_bytes: Optional[int] = None  # the PyTorch backend's budget, F × (total − peak + temporary pool)
    total_gpu_bytes: Optional[int] = None
    free_gpu_memory_fraction: Optional[float] = None
    peak_bytes: Optional[int] = None
    estimated_kv_bytes: Optional[int] = None
    temporary_kv_bytes: Optional[int] = None
    torch_limit_bytes: Optional[int] = None
    engine_size_bytes: Optional[int] = None
    execution_context_bytes: Optional[int] = None
    max_seq_len: Optional[int] = None
    max_num_tokens: Optional[int] = None
    max_batch_size: Optional[int] = None
    kv_bytes_per_token: Optional[int] = None
    free_before_failure_bytes: Optional[int] = None
    available_bytes: Optional[int] = None  # the C++ manager's "available": what F is a share of there
    activation_bytes: Optional[int] = None
    non_torch_bytes: Optional[int] = None
    trt_managed_bytes: Optional[int] = None  # TensorRT's "now: GPU N (MiB)": what it manages for the engine
    max_num_requests: Optional[int] = None
    max_attention_window: Optional[int] = None
    max_beam_width: Optional[int] = None
    weights_outside_torch_bytes: Optional[int] = None
    torch_fraction: Optional[float] = None
    sources: Dict[str, str] = field(default_factory=dict)

    @property
    def target(self) -> "Rank":  # node_rules reads ranks through ``target``
        return self

    @property
    def post_load_avail_bytes(self) -> Optional[int]:
        return None

    @property
    def kv_bytes(self) -> Optional[int]:
        return self.kv_cache_bytes


@dataclass(frozen=True)
class KvPass:
    """One KV pool allocation: the same ``Allocated`` line from each rank that printed it (``lines``)."""

    kv_cache_bytes: Optional[int]
    kv_tokens: Optional[int]
    lines: int
    # "final" | "temporary" (the PyTorch backend's estimation pool) | "draft" | "draft_temporary" (a two-model
    # speculative decoder's pool) | "bookkeeping" (AutoDeploy's page bookkeeping) | "unknown" (a fragment's only pool)
    role: str
    event: LogEvent

    def to_json(self) -> Dict[str, Any]:
        return {"kv_cache_bytes": self.kv_cache_bytes, "kv_tokens": self.kv_tokens, "role": self.role,
                "lines": self.lines, "line": self.event.line}


@dataclass(frozen=True)
class Summary:
    """The node_rules protocol's summary: the final pool's tokens, the request slots and the sequence length."""

    max_total_num_tokens: Optional[int] = None
    max_running_requests: Optional[int] = None
    context_len: Optional[int] = None
    source: str = ""


@dataclass(frozen=True)
class Budget:
    cell_bytes: Optional[int] = None  # KV bytes per token


@dataclass(frozen=True)
class Era:
    """Which sizing code ran: ``backend`` "pytorch" | "cpp" | "autodeploy" | None, and the release the banner names."""

    backend: Optional[str]
    version: Optional[str]
    name: Optional[str]  # "cpp-session" (0.5–0.9), "cpp-executor" (0.10+), "pytorch", "autodeploy"
    clues: Tuple[str, ...]

    @property
    def hint(self) -> Optional[str]:
        words = {"cpp-session": "TensorRT engine, GptSession", "cpp-executor": "TensorRT engine, C++ executor",
                 "pytorch": "PyTorch backend", "autodeploy": "AutoDeploy"}.get(self.name or "")
        if self.version and words:
            return "{} ({})".format(self.version, words)
        return self.version or words


@dataclass(frozen=True)
class Failure(CitesEvent):
    """Why a startup did not finish: a stable cause, the stage, the message, and what the log adds."""

    cause: str
    stage: str
    message: str
    rank: Optional[str]
    event: LogEvent
    component: Optional[str] = None
    stage_table: Tuple[Tuple[str, Optional[int], Optional[int]], ...] = ()  # (stage, free before, free after)
    totals: Tuple[Tuple[str, int], ...] = ()  # ("total gpu memory", bytes), ("free gpu memory before", bytes)


@dataclass(frozen=True)
class Analysis:
    """One TensorRT-LLM startup analysed, then the rule book's findings, recommendations and verdict."""

    target: str
    status: str
    problems: Tuple[Problem, ...]
    era: Era
    server_args: Dict[str, Any]
    startup_index: Optional[int]
    startup_count: Optional[int]
    startup_first_line: Optional[int]
    ranks: Tuple[Rank, ...]
    passes: Tuple[KvPass, ...]
    kv_cache_tokens: Optional[int]
    rank_count: int
    window_cut: Optional[LogEvent]  # the final pass's 'Attention window size … Reducing to'
    user_cap: Optional[LogEvent]  # max_tokens / max_gpu_total_bytes that bound the final pool
    checks: Tuple[KvCheck, ...]
    stages_seen: Tuple[str, ...]
    last_event: Optional[LogEvent]
    complete: bool
    failure: Optional[Failure]
    options: Options
    events: Tuple[LogEvent, ...] = ()
    findings: Tuple[Finding, ...] = ()
    recommendations: Tuple[Recommendation, ...] = ()
    engine: str = ENGINE
    verdict: Optional[Any] = None
    summary: Summary = Summary()
    budget: Budget = Budget()

    @property
    def failed(self) -> Optional[Failure]:
        return self.failure

    def worker_count(self) -> int:
        return self.rank_count

    def final_pass(self) -> Optional[KvPass]:
        return next((p for p in reversed(self.passes) if p.role == "final"), None)

    def binding(self) -> Optional[Rank]:
        """The rank whose figures size the pool: the one with the KV line (every rank takes the smallest count)."""
        known = [r for r in self.ranks if r.kv_cache_bytes is not None]
        return min(known, key=lambda r: r.kv_cache_bytes or 0) if known else None

    def sizing(self) -> Optional[Tuple[int, float, str, Rank]]:
        """(what F is a share of, F, the formula's words, the rank that printed it), from the log's own lines."""
        for r in self.ranks:
            if r.peak_bytes is not None and r.total_gpu_bytes is not None and r.free_gpu_memory_fraction is not None:
                base = r.total_gpu_bytes - r.peak_bytes + (r.temporary_kv_bytes or 0)
                return base, r.free_gpu_memory_fraction, "pytorch", r
        for r in self.ranks:
            if r.available_bytes is not None:
                f = self.fraction_given()
                if f is not None:
                    return r.available_bytes, f[0], "cpp", r
        return None

    def fraction_given(self) -> Optional[Tuple[float, str]]:
        """F and where it comes from: a line that prints it, the arguments, else None (the default is not assumed
        where the launcher could have set it)."""
        for r in self.ranks:
            if r.free_gpu_memory_fraction is not None:
                return r.free_gpu_memory_fraction, r.sources.get("free_gpu_memory_fraction", "")
        value = self.server_args.get("kv_cache_free_gpu_memory_fraction")
        if isinstance(value, float) and 0 < value <= 1:
            return value, "the server's arguments"
        return None

    def process_ceiling(self, cuda_total: int, flags: Dict[str, Any]) -> Optional[Tuple[int, str, bool]]:
        """(what the rank's process holds at its peak, how that is known, True: other processes present at
        startup are inside it) for node_rules' live headroom: NVML's free memory still holds the activation
        peak the sizing reserved. PyTorch backend: the profiled peak − the temporary pool + the KV cache; C++
        eras: what was in use when the pool was sized (total − available) + the KV cache. Both measure the
        device, so what other processes held then is inside."""
        sized, kv = self.sizing(), self.binding()
        if sized is None or kv is None or kv.kv_cache_bytes is None or not self.complete:
            return None
        _, _, how, r = sized
        if how == "pytorch":
            assert r.peak_bytes is not None
            ceiling = r.peak_bytes - (r.temporary_kv_bytes or 0) + kv.kv_cache_bytes
            return ceiling, "the profiled peak {} − the temporary pool {} + the KV cache {} ({})".format(
                gib(r.peak_bytes), gib(r.temporary_kv_bytes or 0), gib(kv.kv_cache_bytes),
                r.sources.get("peak_bytes", "")), True
        assert r.available_bytes is not None
        total = r.total_gpu_bytes or cuda_total
        return total - r.available_bytes + kv.kv_cache_bytes, "in use when the pool was sized ({} − {} available, " \
            "{}) + the KV cache {}".format(gib(total), gib(r.available_bytes), r.sources.get("available_bytes", ""),
                                          gib(kv.kv_cache_bytes)), True

    def memory_pressure(self) -> str:
        ready = next((e for e in self.events if e.kind == "ready"), None)
        if ready is None:
            return ""
        oom = next((e for e in self.events if e.kind == "failure" and _after(e, ready)
                    and e.data.get("cause") == "cuda_out_of_memory"), None)
        return "" if oom is None else "the log shows an out-of-memory error while serving ({})".format(where(oom))

    def headroom(self) -> Tuple[Optional[int], str]:
        """Memory the KV pool left free at the moment it was sized, after a complete startup: what F's share left
        of its base (the PyTorch backend's total − profiled peak + temporary pool, whose peak returns while
        serving; the C++ manager's available memory)."""
        if not self.complete or self.failure is not None:
            return None, ""
        sized, kv = self.sizing(), self.binding()
        if sized is None or kv is None or kv.kv_cache_bytes is None:
            return None, ""
        base, _, how, r = sized
        if how == "pytorch":
            how_words = "total − profiled peak + temporary KV pool ({}) − the KV cache ({})".format(
                r.sources.get("peak_bytes", ""), kv.sources.get("kv_cache_bytes"))
            return base - kv.kv_cache_bytes, how_words
        return base - kv.kv_cache_bytes, "available when the KV cache was sized ({}) − the KV cache ({})".format(
            r.sources.get("available_bytes", ""), kv.sources.get("kv_cache_bytes", ""))

    def kv_change(self, delta_bytes: int, cuda_total: Optional[int] = None,
                  flags: Optional[Dict[str, Any]] = None) -> Optional[KvChange]:
        """The fraction that moves the pool by about ``delta_bytes``: F' = (KV + delta) ÷ base, rounded toward
        the smaller pool to 0.01, below 1 (the C++ manager refuses F ≥ 1)."""
        sized, kv = self.sizing(), self.binding()
        if sized is None or kv is None or kv.kv_cache_bytes is None or self.user_cap is not None:
            return None
        base, f, _, _ = sized
        if base <= 0:
            return None
        new = int((kv.kv_cache_bytes + delta_bytes) * 100 // base) / 100
        if not 0 < new < 1 or abs(new - f) < 0.005:
            return None
        gain = int(new * base) - kv.kv_cache_bytes
        cell = self.budget.cell_bytes
        if not cell:
            return None
        tokens = gain // cell if gain >= 0 else -((-gain) // cell)
        return KvChange(flag=self.fraction_flag(), value="{:.2f}".format(new), gain_bytes=gain, gain_tokens=tokens,
                        rounding=FRACTION_ROUNDING)

    def fraction_flag(self) -> str:
        """Triton's config.pbtxt parameter where Triton runs it (its launch, or its lines in the log), else
        trtllm-serve's option (its YAML's kv_cache_config.free_gpu_memory_fraction is the same knob)."""
        triton = self.server_args.get("launch") == "tritonserver" or any(
            e.fmt in ("ready_triton", "ready_triton_model", "default_fraction") for e in self.events)
        return TRITON_FRACTION if triton else FRACTION_FLAG

    def why_no_kv_change(self, delta_bytes: int, live: bool, cuda_total: Optional[int] = None,
                         flags: Optional[Dict[str, Any]] = None) -> Tuple[str, str]:
        if self.kv_change(delta_bytes, cuda_total, flags) is not None:
            return "", ""
        flag = self.fraction_flag()
        if self.user_cap is not None:
            return ("max_tokens / max_gpu_total_bytes caps the KV cache ({}), so {} sizes nothing".format(
                where(self.user_cap), flag),
                "raise or remove kv_cache_config.max_tokens (or max_gpu_total_bytes) first")
        if self.sizing() is None:
            paste = "pass the whole startup with --log" if live else \
                "paste the startup from the 'Peak memory during memory usage profiling' or 'Memory usage when " \
                "calculating max tokens' line to the server's ready line"
            return ("this log cannot size {} (it prints neither the profiled peak nor the memory the fraction is a "
                    "share of, with the fraction)".format(flag), "this log cannot size {}: {}".format(flag, paste))
        return "", ""


def _after(e: LogEvent, ref: LogEvent) -> bool:
    return (e.line or 0, e.offset) > (ref.line or 0, ref.offset)


# --- building ------------------------------------------------------------------------------

def _ranks(events: Tuple[LogEvent, ...], passes: Tuple[KvPass, ...] = ()) -> Tuple[Rank, ...]:
    """One Rank per tag ("RANK n", or "" for the untagged C++ lines), in the order the log first names them; a
    rank's later line replaces its earlier figure (the final pass, not the temporary one); a draft model's pool
    (or AutoDeploy's bookkeeping) is not the rank's KV cache."""
    skipped = {p.event.text for p in passes if p.role.startswith("draft") or p.role == "bookkeeping"}
    per: Dict[str, Dict[str, Any]] = {}
    for ev in events:
        if ev.kind not in _FIGURE_KINDS or (ev.kind == "allocated" and ev.text in skipped):
            continue
        # A figure line whose prefix a paste stripped is still the runtime's (the formats are its own words).
        _take(per.setdefault(ev.rank or "", {"sources": {}}), ev)
    for ev in events:  # the fraction a both-set warning or Triton's default names, where no line printed it otherwise
        if ev.kind in ("both_set", "fraction_default") and (ev.rank or "") in per:
            per[ev.rank or ""].setdefault("free_gpu_memory_fraction", ev.data["fraction"])
            per[ev.rank or ""]["sources"].setdefault("free_gpu_memory_fraction", where(ev))
    return tuple(Rank(rank=name, **fields) for name, fields in per.items())


def _take(r: Dict[str, Any], ev: LogEvent) -> None:
    for key, value in ev.data.items():
        target = _TAKE.get(key)
        if target is not None and value is not None:
            r[target] = value
            r["sources"][target] = where(ev)
    if ev.kind == "peak" and ev.data.get("fraction") is not None:
        r["free_gpu_memory_fraction"] = ev.data["fraction"]
        r["sources"]["free_gpu_memory_fraction"] = where(ev)


def _pass_groups(events: Tuple[LogEvent, ...]) -> List[List[LogEvent]]:
    """Allocation lines, the same line again with no other KV line between taken as another rank's copy of it."""
    groups: List[List[LogEvent]] = []
    last_text: Optional[str] = None
    for ev in events:
        if ev.kind in ("allocated", "allocated_old") and ev.fmt != "old_bytes":
            if groups and ev.text == last_text and ev.kind == groups[-1][0].kind:
                groups[-1].append(ev)
            else:
                groups.append([ev])
            last_text = ev.text
        elif ev.kind in ("peak", "estimate", "mem_usage", "banner"):
            last_text = None
    return groups


_Raw = Tuple[Optional[int], Optional[int], int, str, LogEvent]


def _kinds_of_pool(groups: List[List[LogEvent]], events: Tuple[LogEvent, ...], era: Era) -> List[_Raw]:
    """(bytes, tokens, copies, "target" | "draft" | "bookkeeping", line) per allocation."""
    old_bytes = next((e.data["kv_cache_bytes"] for e in events if e.fmt == "old_bytes"), None)
    raw: List[_Raw] = []
    for g in groups:
        ev = g[0]
        kv, tokens = ev.data.get("kv_cache_bytes"), ev.data.get("kv_tokens")
        if ev.fmt == "old_tokens":
            kv = old_bytes
        role = "target"
        prev = raw[-1] if raw else None
        if era.name == "pytorch" and prev is not None and prev[3] == "target" and tokens == prev[1] \
                and kv is not None and prev[0] is not None and kv < prev[0]:
            role = "draft"
        elif kv == 0 and tokens:
            role = "bookkeeping"
        raw.append((kv, tokens, len(g), role, ev))
    return raw


def _passes(events: Tuple[LogEvent, ...], era: Era) -> Tuple[KvPass, ...]:
    """The KV allocations in log order. The same token count right after a pool, in fewer bytes, is the draft
    model's pool (two-model speculative decoding). In the PyTorch backend every target pool before the last, and
    any before the profiling result, is the temporary estimation pool (tensorrt_llm/_torch/pyexecutor/_util.py
    KvCacheCreator.try_prepare_estimation); a 0-byte pool under AutoDeploy is its page bookkeeping."""
    raw = _kinds_of_pool(_pass_groups(events), events, era)
    targets = [i for i, r in enumerate(raw) if r[3] == "target"]
    last_target = targets[-1] if targets else -1
    # The estimation's end: the profiling result, or (1.3) the draft pool sized "for estimation dry run".
    markers = [e for e in events if e.kind in ("peak", "estimate", "dry_run")]
    out: List[KvPass] = []
    for i, (kv, tokens, lines, role, ev) in enumerate(raw):
        estimation = era.name == "pytorch" and (i < last_target or any(_after(m, ev) for m in markers))
        if role == "target":
            role = "temporary" if estimation else "final"
            if role == "final" and era.name == "pytorch" and len(targets) == 1 and _undecided(ev, events, markers):
                role = "unknown"
        elif role == "draft":
            role = "draft_temporary" if estimation else "draft"
        out.append(KvPass(kv_cache_bytes=kv, kv_tokens=tokens, lines=lines, role=role, event=ev))
    return tuple(out)


def _undecided(ev: LogEvent, events: Tuple[LogEvent, ...], markers: List[LogEvent]) -> bool:
    """The PyTorch backend's only pool, before any profiling line and with no ready line after it: the
    estimation pool or the real one, a fragment cannot tell."""
    return not any(_after(ev, m) for m in markers) and not any(r.kind == "ready" and _after(r, ev) for r in events)


def _era(events: Tuple[LogEvent, ...]) -> Era:
    version = next((e.data["version"] for e in events if e.kind == "banner"), None)
    backend = next((e.data["backend"] for e in events if e.kind == "backend"), None)
    clues: List[str] = []
    if version:
        clues.append("banner 'TensorRT-LLM version: {}'".format(version))
    name: Optional[str] = None
    if backend in ("_autodeploy", "autodeploy") or any(e.data.get("logger") == "autodeploy" for e in events):
        name = "autodeploy"
    elif backend == "pytorch" or any(e.kind in _PYTORCH_KINDS or e.fmt == "both_set_py" for e in events):
        name = "pytorch"
        clues.append("the PyTorch backend's memory profiling lines")
    elif any(e.data.get("module") in ("batchmgr", "_torch") for e in events):
        name = "pytorch"  # 2026's module-tagged format (PR #13202): the PyTorch backend is the default by then
        clues.append("2026's module-tagged log format ([batchmgr], [_torch])")
    elif any(e.fmt == "old_tokens" for e in events):
        name = "cpp-session"
        clues.append("GptSession's 'Using N tokens in paged KV cache'")
    elif any(e.kind in ("mem_usage", "allocated", "engine") for e in events):
        name = "cpp-executor"
        clues.append("the C++ KV manager's lines without PyTorch profiling")
    return Era(backend=backend, version=version, name=name, clues=tuple(clues))


FLAGS = {
    "kv_cache_free_gpu_memory_fraction": flags.number(0, 1), "max_batch_size": flags.count(1),
    "max_num_tokens": flags.count(1), "max_seq_len": flags.count(1), "tp_size": flags.count(1, 1 << 16),
    "pp_size": flags.count(1, 1 << 16), "backend": flags.TEXT, "model": flags.TEXT, "model_path": flags.TEXT,
    "launch": flags.TEXT, "kv_cache_dtype": flags.TEXT, "max_tokens": flags.count(1),
    "max_gpu_total_bytes": flags.count(1, 1 << 60), "host_cache_size": flags.count(0, 1 << 60),
    "capacity_scheduler_policy": flags.TEXT, "config_file": flags.TEXT,
}


def _server_args(fallback_args: Optional[Dict[str, Any]]) -> Tuple[Dict[str, Any], Tuple[Problem, ...]]:
    given, dropped = flags.typed(fallback_args or {}, FLAGS, "the server's command line")
    return dict(given), tuple(dropped)


def _stages(events: Tuple[LogEvent, ...]) -> Tuple[List[str], Optional[LogEvent]]:
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


def _before_ready(events: Tuple[LogEvent, ...]) -> Tuple[LogEvent, ...]:
    ready = next((e for e in events if e.kind == "ready"), None)
    return events if ready is None else tuple(e for e in events if not _after(e, ready))


def _failure(events: Tuple[LogEvent, ...], stages: List[str]) -> Optional[Failure]:
    """The first failure line before ready, with what follows it (the component, the stage table, the totals);
    an exception alone ends a startup only when nothing of TensorRT-LLM's came after it."""
    own = _before_ready(events)
    found = _primary_failure(own, stages)
    if found is None:
        return None
    primary, cause = found
    details = [e for e in own if e.kind == "failure_detail"]
    component = next((e.data["component"] for e in details if "component" in e.data), None)
    table = tuple((e.data["label"], e.data["free_before_bytes"], e.data["free_after_bytes"])
                  for e in details if e.data.get("table_row"))
    totals = tuple((e.data["label"], e.data["bytes"]) for e in details if "bytes" in e.data and e.data["bytes"])
    if primary.data.get("total_bytes") is not None:  # torch's out-of-memory message: total and free at the moment
        totals += (("total gpu memory", primary.data["total_bytes"]), ("free gpu memory at the failure",
                                                                         primary.data["free_bytes"]))
    stage = {"max_tokens_too_small": "kv_cache", "executor_insufficient_memory": "executor"}.get(
        cause, stages[-1] if stages else "unknown")
    return Failure(cause=cause, stage=stage, message=primary.text, rank=primary.rank or None, event=primary,
                   component=component, stage_table=table, totals=totals)


def _primary_failure(own: Tuple[LogEvent, ...], stages: List[str]) -> Optional[Tuple[LogEvent, str]]:
    """(the line, its cause): a named failure first, then an out-of-memory error, then a last exception."""
    failures = [e for e in own if e.kind == "failure"]
    primary = next((e for e in failures if e.data.get("cause") != "cuda_out_of_memory"), None) \
        or (failures[0] if failures else None)
    if primary is not None:
        return primary, primary.data["cause"]
    exc = [e for e in own if e.kind == "exception"]
    if not exc or "ready" in stages or any(_after(e, exc[-1]) for e in own if e.kind in _STAGE_OF_KIND):
        return None
    return exc[-1], "exception"


def _with_failure_figures(ranks: Tuple[Rank, ...], failure: Optional[Failure]) -> Tuple[Rank, ...]:
    """The free memory a failure's table (or torch's message) gives, on the first rank; a pasted failure alone is
    a rank of its own (its table is the only figure)."""
    before = _free_before(failure)
    if before is None or failure is None:
        return ranks
    if not ranks:
        total = next((b for label, b in failure.totals if "total" in label), None)
        ranks = (Rank(rank=failure.rank or "", total_gpu_bytes=total,
                      sources={"total_gpu_bytes": failure.where} if total is not None else {}),)
    first = ranks[0]
    patched = dict(first.__dict__, free_before_failure_bytes=before,
                   sources={**first.sources, "free_before_failure_bytes": failure.where})
    return (Rank(**patched),) + ranks[1:]


def _free_before(failure: Optional[Failure]) -> Optional[int]:
    if failure is None:
        return None
    before = next((b for label, b in failure.totals if "free" in label), None)
    if before is None and failure.stage_table:
        before = failure.stage_table[-1][2]
    return before


def _rank_count(events: Tuple[LogEvent, ...], passes: Tuple[KvPass, ...], args: Dict[str, Any]) -> int:
    """Ranks the log shows: its [RANK n] tags, the copies of one C++ line (one per rank), MPI's world size,
    and tensor × pipeline parallel where the arguments say it — the largest of them."""
    tags = {e.rank for e in events if e.rank}
    copies = max((p.lines for p in passes), default=0)
    world = max((e.data.get("world_size") or 0 for e in events if e.kind == "mpi"), default=0)
    parallel = 1
    for key in ("tp_size", "pp_size"):
        value = args.get(key)
        parallel *= value if isinstance(value, int) and 0 < value <= 4096 else 1
    return max(len(tags), copies, world, parallel, 1)


def _cell_bytes(ranks: Tuple[Rank, ...], final: Optional[KvPass]) -> Optional[int]:
    """KV bytes per token: the profiling line's own figure, else the final pool's bytes ÷ its tokens."""
    exact = next((r.kv_bytes_per_token for r in ranks if r.kv_bytes_per_token), None)
    if exact:
        return exact
    if final is None or not final.kv_cache_bytes or not final.kv_tokens:
        return None
    cell = final.kv_cache_bytes // final.kv_tokens
    return cell if cell >= 1 else None


def _window_cut(events: Tuple[LogEvent, ...], final: Optional[KvPass], era: Era) -> Optional[LogEvent]:
    """The window cut that stands: the last one, except in the PyTorch backend where the estimation pool's cut is
    expected and undone by the real pool's (only a cut after the final pool's sizing began counts)."""
    cuts = [e for e in events if e.kind == "window_cut" and e.data.get("reduced_to") is not None
            and (e.data["window"] is None or e.data["reduced_to"] < e.data["window"])]
    if not cuts:
        return None
    if era.name != "pytorch":
        return cuts[-1]
    if final is None:
        return None
    last = cuts[-1]
    # After the profiling result or after an estimation pool: the real pool's sizing cut it.
    sized = any(e.kind in ("peak", "estimate") and not _after(e, last) for e in events)
    return last if sized or final.role == "final" and any(
        e.kind == "allocated" and _after(last, e) for e in events) else None


def _user_cap(events: Tuple[LogEvent, ...], era: Era, final: Optional[KvPass]) -> Optional[LogEvent]:
    """A max_tokens / max_gpu_total_bytes the user gave that bound the final pool (``_pytorch_cap``); in the C++
    eras a both-set warning whose max_tokens is the pool's size (the PyTorch backend prints that warning in every
    startup: its estimator fills max_tokens in itself)."""
    cap = _pytorch_cap(events)
    if cap is not None:
        return cap
    if era.name in ("pytorch", "autodeploy") or final is None or not final.kv_tokens:
        return None
    both = [e for e in events if e.kind == "both_set" and not _after(e, final.event)]
    if both and both[-1].data.get("max_tokens") is not None and both[-1].data["max_tokens"] <= final.kv_tokens:
        return both[-1]
    return None


def _pytorch_cap(events: Tuple[LogEvent, ...]) -> Optional[LogEvent]:
    """The PyTorch backend's 'is provided' line whose limit became the new max memory (2026), or left less than the
    profiled budget (1.1, which prints no limit)."""
    tolerance = 2 * PRINT_TOLERANCE_BYTES
    budget = next((e.data["available_kv_bytes"] for e in events if e.kind == "peak"
                   and e.data.get("available_kv_bytes") is not None), None)
    for ev in events:
        if ev.kind != "user_cap" or ev.data.get("capped_bytes") is None:
            continue
        limit = ev.data.get("limit_bytes") or ev.data.get("max_gpu_total_bytes")
        if limit is not None and abs(limit - ev.data["capped_bytes"]) <= tolerance:
            return ev
        if limit is None and budget is not None and ev.data["capped_bytes"] < budget - tolerance:
            return ev
    return None


def _checks(ranks: Tuple[Rank, ...], final: Optional[KvPass], analysis_fraction: Optional[float]) -> List[KvCheck]:
    out: List[KvCheck] = []
    for r in ranks:
        if r.peak_bytes is not None and r.total_gpu_bytes is not None and r.free_gpu_memory_fraction is not None \
                and r.available_kv_bytes is not None:
            base = r.total_gpu_bytes - r.peak_bytes + (r.temporary_kv_bytes or 0)
            out.append(KvCheck(
                rank=r.rank, formula="free_gpu_memory_fraction × (device total − profiled peak + temporary KV pool) "
                "(TensorRT-LLM 1.0+ tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator)",
                predicted_bytes=int(r.free_gpu_memory_fraction * base), logged_bytes=r.available_kv_bytes,
                tolerance_bytes=4 * PRINT_TOLERANCE_BYTES,
                evidence=(r.sources.get("peak_bytes", ""),)))
        if r.available_bytes is not None and analysis_fraction is not None and final is not None \
                and final.kv_cache_bytes and final.role == "final":
            out.append(KvCheck(
                rank=r.rank, formula="free_gpu_memory_fraction × available (TensorRT-LLM 0.10+ batch_manager/"
                "kvCacheManager.cpp calculateMaxNumBlocks / calculateFreeMemBytes)",
                predicted_bytes=int(analysis_fraction * r.available_bytes), logged_bytes=final.kv_cache_bytes,
                tolerance_bytes=4 * PRINT_TOLERANCE_BYTES + (r.tokens_per_block or 64) * (r.kv_bytes_per_token or 0),
                evidence=(r.sources.get("available_bytes", ""), where(final.event))))
    return out


def build_analysis(startup: Startup, target: str, opts: Options, index: Optional[int] = None,
                   count: Optional[int] = None, reader_notes: Tuple[str, ...] = (),
                   fallback_args: Optional[Dict[str, Any]] = None) -> Analysis:
    """``fallback_args``: the live server's flags (its command line and config files)."""
    events = startup.events
    era = _era(events)
    args, arg_problems = _server_args(fallback_args)
    passes = _passes(events, era)
    final = next((p for p in reversed(passes) if p.role == "final"), None)
    stages, last = _stages(events)
    failure = _failure(events, stages)
    complete = startup.closed and failure is None and "ready" in stages
    ranks = _with_failure_figures(_ranks(events, passes), failure)
    tokens = final.kv_tokens if final is not None else None
    runtime = next((r for r in ranks if r.max_batch_size is not None or r.max_seq_len is not None), None)
    analysis = Analysis(
        target=target, status="ok" if complete or failure is not None else "partial",
        problems=_problems(reader_notes, complete, failure, stages, passes, ranks) + arg_problems,
        era=era, server_args=args, startup_index=index, startup_count=count,
        startup_first_line=startup.first_line, ranks=ranks, passes=passes, kv_cache_tokens=tokens,
        rank_count=_rank_count(events, passes, args), window_cut=_window_cut(events, final, era),
        user_cap=_user_cap(events, era, final), checks=(), stages_seen=tuple(stages), last_event=last,
        complete=complete, failure=failure, options=opts, events=events,
        budget=Budget(cell_bytes=_cell_bytes(ranks, final)),
        summary=Summary(max_total_num_tokens=tokens,
                        max_running_requests=runtime.max_batch_size if runtime is not None else None,
                        context_len=runtime.max_seq_len if runtime is not None else None,
                        source=where(final.event) if final is not None else ""))
    f = analysis.fraction_given()
    from dataclasses import replace

    return replace(analysis, checks=tuple(_checks(ranks, final, f[0] if f else None)))


def _problems(reader_notes: Tuple[str, ...], complete: bool, failure: Optional[Failure], stages: List[str],
              passes: Tuple[KvPass, ...], ranks: Tuple[Rank, ...]) -> Tuple[Problem, ...]:
    problems: List[Problem] = [Problem("log.reader", note) for note in reader_notes]
    if not complete and failure is None:
        problems.append(Problem("log.fragment", "the log stops before the server was ready (last stage: {})".format(
            STAGE_WORDS.get(stages[-1], "none") if stages else "none")))
    if passes and all(p.role in ("unknown", "temporary", "draft_temporary") for p in passes):
        problems.append(Problem("log.estimation_only", "the log's only KV pool may be (or is) the PyTorch backend's "
                                "temporary estimation pool, not the KV cache it serves with: the real pool is "
                                "allocated after the profiling run, which this log does not reach"))
    if passes and all(p.role == "bookkeeping" for p in passes):
        problems.append(Problem("log.bookkeeping_pool", "the only KV line is AutoDeploy's page bookkeeping "
                                "('Allocated 0.00 GiB … ({:,})'): AutoDeploy sizes its cache itself and prints no "
                                "figure for it".format(passes[-1].kv_tokens or 0)))
    if not ranks:
        problems.append(Problem("log.no_ranks", "no memory lines in this startup"))
    return tuple(problems)
