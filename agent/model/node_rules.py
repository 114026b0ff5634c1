"""Engine-neutral rules: what a node's GPUs and processes say, and the three questions both a log
and a live node answer (is memory unused, are ranks unbalanced, what bounds concurrency).

Each rule is one function of the ``Context``: with a live node it measures (NVML now, or the
engine run's recorded low-water mark); from a log alone it uses the startup's own figures. The
engine's analysis is read through a small protocol every engine provides: ``failed``,
``headroom()``, ``kv_change(delta, cuda_total, flags)``, ``why_no_kv_change(…)``, ``budget.cell_bytes``,
``server_args``, ``summary`` (``max_total_num_tokens``, ``max_running_requests``, ``context_len``,
``source``), ``ranks`` (``rank``, ``target.post_load_avail_bytes``, ``target.sources``) and
``engine_warnings(kind)`` ((text, evidence) pairs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from kvforensics.agent.model.citing import and_list
from kvforensics.agent.model.kinds import Owner
from kvforensics.agent.model.records import Finding, KvChange
from kvforensics.agent.plugin import ENGINES, EngineModel, display
from kvforensics.collectors.units import gib

if TYPE_CHECKING:
    from kvforensics.agent.model.context import Context
    from kvforensics.agent.model.live import GpuLedger, Inspection

UNUSED_WARN_BYTES = 512 << 20  # reclaimable memory below this is not worth a flag change
IMBALANCE_WARN_BYTES = 512 << 20  # free-memory spread across ranks worth reporting
# A change is worth a restart only if it adds at least this share of the KV pool's tokens
# (a raise into unused memory, fewer CUDA graphs, a HiCache tier) ...
MIN_GAIN_POOL_SHARE = 0.05
# "Measured" means the lowest free memory under real load: a recorded history of the engine run
# spanning at least this long, with at least this many samples. Anything less is one look.
MEASURED_MIN_SPAN_S = 600
MEASURED_MIN_SAMPLES = 3


def worth_it(gain_tokens: Optional[int], pool_tokens: Optional[int]) -> bool:
    """A token gain worth a restart: ≥ MIN_GAIN_POOL_SHARE of the pool (any gain when the pool is unknown)."""
    if gain_tokens is None or gain_tokens <= 0:
        return False
    return pool_tokens is None or gain_tokens >= MIN_GAIN_POOL_SHARE * pool_tokens


def gain_requests(pool_tokens: Optional[int], gain_tokens: int, context_len: Optional[int], request_tokens: int,
                  slots: Optional[int] = None) -> Dict[str, Optional[int]]:
    """More requests that fit at once when a pool of ``pool_tokens`` KV tokens gains ``gain_tokens``: at
    context_len and at --request-tokens, capped by the request slots when the engine has a known count."""
    if pool_tokens is None:
        return {"at_context_len": None, "at_request_tokens": None}
    cap = slots or 10**9
    t = pool_tokens

    def more(length: int) -> int:
        return min(cap, (t + gain_tokens) // length) - min(cap, t // length)

    return {"at_context_len": more(context_len) if context_len else None,
            "at_request_tokens": more(request_tokens)}


def engine_model(ctx: "Context") -> Optional[EngineModel]:
    """The plug-in of the engine explained (agent/plugin.py), or None when none is known."""
    return ENGINES.find(ctx.engine_kind)


def engine_name(ctx: "Context") -> str:
    return display(ctx.engine_kind)


def budget_flag(ctx: "Context") -> str:
    model = engine_model(ctx)
    return model.budget_flag if model is not None else "KV budget"


# --- the figures rules and exporters share -------------------------------------------------

@dataclass(frozen=True)
class Headroom:
    """The least free memory the engine has, and how it was measured."""

    free_bytes: int
    how: str  # a sentence for the finding's detail
    evidence: str
    gpu: Optional[GpuLedger] = None  # live only
    measured: bool = False  # over a recorded history long enough to count (MEASURED_MIN_*), not one look

    def spare(self, margin_bytes: int) -> int:
        return self.free_bytes - margin_bytes


def _span(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return "{:.0f} days".format(seconds / 86400)
    if seconds >= 2 * 3600:
        return "{:.0f} hours".format(seconds / 3600)
    if seconds >= 120:
        return "{:.0f} minutes".format(seconds / 60)
    return "{:.0f} seconds".format(seconds)


def is_measured(history: Optional[object]) -> bool:
    """Whether a recorded engine run is long enough to call its low-water mark a measurement."""
    return history is not None and history.samples >= MEASURED_MIN_SAMPLES \
        and history.span_s >= MEASURED_MIN_SPAN_S  # type: ignore[attr-defined]


def lowest_free(insp: Inspection) -> Optional[Headroom]:
    """The engine's least free GPU: the run's low-water mark when recorded history holds at
    least two samples (a measurement only when it spans MEASURED_MIN_*), else NVML now."""
    gpus = [g for g in insp.engine_gpus if g.free_bytes is not None]
    if not gpus or any(g.status == "lost" for g in insp.gpus):
        return None  # a lost GPU: the engine is down or degraded, nothing is "unused"
    now = min(gpus, key=lambda g: g.free_bytes or 0)
    assert now.free_bytes is not None
    evidence = "nvmlDeviceGetMemoryInfo_v2(GPU {}).free".format(now.index)
    h = insp.history
    if h is not None and h.samples >= 2:
        engine_idx = {g.index: g for g in insp.engine_gpus}
        marks = [(lw.min_free_bytes, engine_idx[lw.gpu]) for lw in h.gpus
                 if lw.gpu in engine_idx and lw.min_free_bytes is not None]
        if marks:
            value, gpu = min(marks, key=lambda m: m[0])
            if now.free_bytes < value:
                value, gpu = now.free_bytes, now
            lowest = "lowest free {} on GPU {}".format(gib(value), gpu.index)
            if is_measured(h):
                how = "measured over {}, {:,} samples: {}".format(_span(h.span_s), h.samples, lowest)
            else:  # the low-water mark is still the safest figure to size from, but not a measurement
                how = ("one look: {:,} samples over {} recorded (a measurement needs {:.0f} minutes and {} "
                       "samples): {}").format(h.samples, _span(h.span_s), MEASURED_MIN_SPAN_S / 60,
                                              MEASURED_MIN_SAMPLES, lowest)
            return Headroom(value, how, "nvmlDeviceGetMemoryInfo_v2(GPU {}).free".format(gpu.index), gpu,
                            is_measured(h))
    return Headroom(now.free_bytes, "one look (NVML now): {} free on GPU {}".format(gib(now.free_bytes), now.index),
                    evidence, now)


def live_settings(insp: Inspection) -> Dict[str, Any]:
    """The running engine's settings: its command line, and what its /metrics says it runs with
    (vLLM's cache_config_info), which wins (it is the effective value)."""
    out = dict(insp.engine_args or {})
    out.update({k: v for k, v in (insp.snapshot.http.cache_config or {}).items() if v is not None})
    return out


def _within_ceiling(insp: Inspection, h: Optional[Headroom]) -> Optional[Headroom]:
    """An engine whose budget reserves room it frees between peaks (vLLM profiles its activation peak
    into T·u, then releases it) has less headroom than NVML shows now: on each engine GPU, at most
    total − reserved − the process's ceiling (``process_ceiling``) − other processes. Where that
    cannot be computed (no log, no reserved figure, a budget not set by u), there is no honest figure."""
    a = insp.analysis
    ceiling_of = getattr(a, "process_ceiling", None)
    if ceiling_of is None:  # without its log, NVML free holds the reserve, unless the budget frees a peak
        model = ENGINES.find(insp.engine_kind)
        return None if model is not None and model.frees_profiled_peak else h
    if h is None:
        return h
    for g in insp.engine_gpus:
        if g.total_bytes is None or g.reserved_bytes is None:
            return None
        got = ceiling_of(g.total_bytes - g.reserved_bytes, live_settings(insp))
        if got is None:
            return None
        ceiling, how, others_inside = got
        # beside the worker: other processes, and the engine's own processes that are no worker (an API
        # server's CUDA context): the worker's ceiling covers only itself
        others = 0 if others_inside else sum(p.used_bytes or 0 for p in g.processes
                                             if p.owner is not Owner.ENGINE or p.rank is None)
        # what the ceiling already holds of them (vLLM's free memory at startup: the co-tenants then)
        others = max(0, others - getattr(a, "others_held_at_start", lambda: 0)())
        room = g.total_bytes - g.reserved_bytes - ceiling - others
        if room < 0:
            return None  # the engine runs past what its own budget allows: the formula does not fit this node
        if room < h.free_bytes:
            h = Headroom(room, "by design on GPU {}: total − reserved − {}{} = {} (NVML free now {}, which still "
                               "holds the activation peak the budget reserves and frees after profiling)".format(
                                   g.index, how, " − other processes" if others else "", gib(room),
                                   gib(g.free_bytes) if g.free_bytes is not None else "unknown"),
                         "nvmlDeviceGetMemoryInfo_v2(GPU {}) total, reserved; the startup log".format(g.index), g,
                         h.measured)
    return h


def headroom(ctx: "Context") -> Optional[Headroom]:
    """Free memory the rules size from: live when there is a node, else the startup log's."""
    if ctx.live is not None:
        return _within_ceiling(ctx.live, lowest_free(ctx.live))
    a = ctx.analysis
    if a is None:
        return None
    free, src = a.headroom()
    return None if free is None else Headroom(free, src, src)


def unused_bytes(ctx: "Context") -> Optional[int]:
    """Memory a larger KV budget could take: the headroom beyond the margin, never negative
    (the figure of the unused_gpu_memory finding and of the engine_unused_bytes metric)."""
    h = headroom(ctx)
    return None if h is None else max(0, h.spare(ctx.options.margin_bytes))


@dataclass(frozen=True)
class Spare:
    """The headroom beyond the margin and the engine's flag change that would use it: the one
    computation the unused_gpu_memory finding quotes and the raise (or lower) recommends."""

    headroom: Headroom
    spare_bytes: int  # beyond the margin; negative: short of it
    change: Optional[KvChange]  # None when the engine's budget inputs are unknown
    worth_it: bool  # spare ≥ UNUSED_WARN_BYTES and the raise adds ≥ MIN_GAIN_POOL_SHARE of the pool
    # (why, action) when the engine gives no change: the margin exceeds the GPU, a cut would leave no KV
    # cache, the log lacks the budget's inputs (the engine's ``why_no_kv_change``); ("", "") otherwise
    no_change: Tuple[str, str] = ("", "")
    # Short of the margin: the evidence that memory runs out under load (``pressure``), without which no cut
    # of the KV budget is advised; "" when there is none (or nothing is short)
    pressure: str = ""

    @property
    def cut_advised(self) -> bool:
        return self.spare_bytes < 0 and bool(self.pressure)


def margin_words(options: Any) -> str:
    """'2.00 GiB margin (--margin's default)': the margin and where it comes from, wherever it is quoted."""
    return "{} margin ({})".format(gib(options.margin_bytes), "--margin" if options.margin_given else
                                   "--margin's default")


def pressure(ctx: "Context", h: Headroom) -> str:
    """Evidence that memory runs short under load, which alone justifies a smaller KV budget: a low-water mark
    below the margin measured over a recorded history (``is_measured``), or what the engine's log shows (its
    analysis' ``memory_pressure``: today an out-of-memory error after the engine was ready, SGLang's and
    vLLM's). One look at NVML, or thin headroom in a startup log, is not: a server that reached ready with
    little free memory is working as sized, and is watched (``record``), not cut."""
    if h.measured and h.free_bytes < ctx.options.margin_bytes:
        return "the low-water mark, {}".format(h.how)
    a = ctx.analysis
    said = getattr(a, "memory_pressure", None)
    return (said() or "") if callable(said) else ""


def spare_memory(ctx: "Context") -> Optional[Spare]:
    """None without a headroom, or offline when the startup failed (nothing was left over)."""
    a = ctx.analysis
    if ctx.live is None and (a is None or a.failed is not None):
        return None
    h = headroom(ctx)
    if h is None:
        return None
    spare = h.spare(ctx.options.margin_bytes)
    sized = a is not None and a.failed is None and spare != 0
    cuda_total, flags = live_sizing(ctx, h)
    change = a.kv_change(spare, cuda_total, flags) if sized else None
    no_change = a.why_no_kv_change(spare, ctx.live is not None, cuda_total, flags) if sized and change is None \
        else ("", "")
    pool = a.summary.max_total_num_tokens if a is not None else None
    worth = spare >= UNUSED_WARN_BYTES and (change is None or worth_it(change.gain_tokens, pool))
    return Spare(h, spare, change, worth, no_change, pressure(ctx, h) if spare < 0 else "")


def live_sizing(ctx: "Context", h: Headroom) -> Tuple[Optional[int], Optional[Dict[str, Any]]]:
    """(the CUDA total of the least free GPU: NVML total − reserved, the running server's flags) on a live
    node, for an engine whose budget is a share of the total; (None, None) from a log."""
    if ctx.live is None:
        return None, None
    g = h.gpu
    total = g.total_bytes - g.reserved_bytes if g and g.total_bytes and g.reserved_bytes is not None else None
    return total, live_settings(ctx.live)


def cell_bytes(ctx: "Context") -> Optional[int]:
    return ctx.analysis.budget.cell_bytes if ctx.analysis is not None else None


# --- node state (live only) ----------------------------------------------------------------

def nvml_unavailable(ctx: "Context") -> Iterator[Finding]:
    nv = ctx.live.snapshot.nvml if ctx.live else None
    if nv is not None and nv.unavailable:
        msg = "; ".join(p.message for p in nv.problems) or "NVML unavailable"
        yield Finding(code="nvml_unavailable", severity="warning", title="No GPU information: " + msg,
                      detail="Without NVML kvforensics cannot see GPU memory; host memory and engine processes are "
                      "still reported.", evidence=("nvml",), proof=msg,
                      action="check the NVIDIA driver with nvidia-smi, or pass --nvml-lib PATH")


def gpu_lost(ctx: "Context") -> Iterator[Finding]:
    for g in ctx.live.gpus if ctx.live else ():
        if g.status == "lost":
            yield Finding(code="gpu_lost", severity="critical", title="GPU {} is lost".format(g.index),
                          detail="NVML answers GPU_IS_LOST: the GPU fell off the bus or hit a fatal error. It needs a "
                          "reset (nvidia-smi -r) or a reboot; any engine rank on it is dead.",
                          evidence=("nvmlDeviceGetHandleByIndex({})".format(g.index),),
                          proof="NVML answers GPU_IS_LOST for GPU {}".format(g.index),
                          action="reset GPU {} (nvidia-smi -r -i {}) or reboot the node".format(g.index, g.index))


def _or_list(words: List[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else "".join(words)


def engine_not_found(ctx: "Context") -> Iterator[Finding]:
    if ctx.live is not None and ctx.live.engine is None and ctx.live.snapshot.engines:
        yield _not_named(ctx.live.snapshot)
    elif ctx.live is not None and ctx.live.engine is None:
        engines = ENGINES.all()
        yield Finding(
            code="engine_not_found",
            severity="info",
            title="No {} server on this node".format(_or_list([display(e.name) for e in engines])),
            detail="Looked for {} command lines in /proc.".format(and_list(h for e in engines for h in e.process_hint)),
            evidence=("/proc/*/cmdline",),
        )


def _selector(e: Any) -> str:
    """The --engine value that names this server on its node: its pod and port in a pod, else its port."""
    from kvforensics.collectors import selection  # only where a server is to be named: most nodes' rules never need it

    return selection.text(e.port, (e.pod.namespace, e.pod.name) if e.pod is not None else None)


def _not_named(snap: Any) -> Finding:
    """--engine named no server on this node, or several (pods on one node may serve on the same port)."""
    servers = sorted((e for e in snap.engines if e.server is not None),
                     key=lambda e: ("" if e.pod is None else e.pod.namespace + "/" + e.pod.name, e.port))
    names = list(dict.fromkeys(_selector(e) for e in servers))
    problems = {p.code: p.message for p in snap.problems}
    action = "pass --engine {}".format(names[0]) if names else ""
    if "engines.ambiguous" in problems:
        return Finding(code="engine_not_found", severity="warning", title="--engine names several servers",
                       detail="{}. Pods on one node may run the same engine on the same port, each in its own "
                              "network namespace.".format(problems["engines.ambiguous"]),
                       evidence=("/proc/*/cmdline", "/proc/*/cgroup"), action=action)
    if "engines.not_found" in problems:
        return Finding(code="engine_not_found", severity="warning", title="No server in the pod asked for (--engine)",
                       detail="{}: pass one of them to --engine.".format(problems["engines.not_found"]),
                       evidence=("/proc/*/cmdline", "/proc/*/cgroup"), action=action)
    return Finding(code="engine_not_found", severity="warning", title="No server on the port asked for (--engine)",
                   detail="This node runs {} server(s), on port(s) {}: pass one of them to --engine.".format(
                       len(names), ", ".join(names) or "none visible"),
                   evidence=("/proc/*/cmdline",), action=action)


def engine_log_missing(ctx: "Context") -> Iterator[Finding]:
    insp = ctx.live
    if insp is None or insp.engine is None or insp.analysis is not None:
        return
    log = insp.snapshot.engine_log
    problems = list(log.problems) + [p for p in insp.problems if p.code == "engine_log.other_engine"]
    why = "; ".join(p.message for p in problems) or "no startup lines"
    yield Finding(
        code="engine_log_missing",
        severity="warning",
        title="The engine's startup log could not be read",
        detail=why + ". Live GPU numbers are shown, but not what the engine allocated; pass "
        "--log PATH|journal:UNIT|docker:NAME.",
        evidence=(log.source or "engine_log",),
        proof=why,
        action="pass --log PATH|journal:UNIT|docker:NAME",
    )


# --- the questions logs and live nodes share -----------------------------------------------


def unused_gpu_memory(ctx: "Context") -> Iterator[Finding]:
    """Unused memory beyond the margin worth a flag change (warning), or less free than the margin
    (low_headroom). The tokens it quotes are the raise's own (``spare_memory``), not a second estimate;
    when the engine cannot size the change, it says why and what to do instead (its ``action``)."""
    found = spare_memory(ctx)
    if found is None:
        return
    h, margin = found.headroom, ctx.options.margin_bytes
    if not found.worth_it:
        if h.free_bytes < margin:
            yield _low_headroom(ctx, found, margin)
        return
    spare = found.spare_bytes
    gain = _quoted_gain(ctx, found)
    why, action = found.no_change
    note = "; " + why if why else ""
    if ctx.live is not None:
        low = h.gpu
        assert low is not None
        yield Finding(
            code="unused_gpu_memory",
            severity="warning",
            title="{} unused on each of the engine's {} GPU(s)".format(gib(spare), len(ctx.live.engine_gpus)),
            detail="{} ({} {}). {} sizes every rank alike, so the least free GPU is what can be given to the "
            "KV pool. Minus the {}: {}{}{}.{}".format(
                h.how, low.rank, low.name or "", engine_name(ctx), margin_words(ctx.options), gib(spare), gain, note,
                _since_startup(ctx, h, " ")
            ),
            bytes=spare,
            evidence=(h.evidence,),
            proof="{} {} on GPU {}{} − {} = {}".format(
                gib(h.free_bytes), _free_words(h), low.index,
                _since_startup_short(ctx, h), margin_words(ctx.options), gib(spare)),
            action=action,
        )
        return
    yield Finding(
        code="unused_gpu_memory",
        severity="warning",
        title="{} of GPU memory sits unused on every GPU after startup".format(gib(spare)),
        detail="{} free after startup ({}), minus the {} kept for runtime activations, leaves {} "
        "the KV pool could use{}{}.".format(gib(h.free_bytes), h.how, margin_words(ctx.options), gib(spare), gain,
                                            note),
        bytes=spare,
        evidence=(h.evidence,),
        proof="{} free after startup − {} = {}; {}".format(gib(h.free_bytes), margin_words(ctx.options), gib(spare),
                                                          h.how),
        action=action,
    )


def _since_startup(ctx: "Context", h: Headroom, lead: str) -> str:
    """The log's free memory after startup against the live figure, and who took the difference since: the
    engine itself (its allocator keeps what serving used) or the other processes on that GPU. '' when the
    two agree within the log's rounding, or either is unknown."""
    a, g = ctx.analysis, h.gpu
    if a is None or g is None or ctx.live is None:
        return ""
    logged, _ = a.headroom()
    if logged is None or abs(logged - h.free_bytes) < SAME_FREE_BYTES:
        return ""
    now = "now" if not h.measured else "at the low-water mark"
    if logged < h.free_bytes:
        return "{}The log had {} free after startup: {} more is free {}.".format(
            lead, gib(logged), gib(h.free_bytes - logged), now)
    others = sum(p.used_bytes or 0 for p in g.processes if p.owner is not Owner.ENGINE)
    who = "other processes on it hold {}".format(gib(others)) if others else \
        "by the engine itself (its allocator keeps what serving used)"
    return "{}The log had {} free after startup: {} taken since, {}.".format(
        lead, gib(logged), gib(logged - h.free_bytes), who)


def _free_words(h: Headroom) -> str:
    """What the live headroom figure is: NVML's free now, a recorded low-water mark, or the engine's own
    budget's limit (``_within_ceiling``: NVML free still holds a peak the budget frees)."""
    if h.how.startswith("by design"):
        return "free by design"
    return "lowest free" if h.measured else "free now"


def _since_startup_short(ctx: "Context", h: Headroom) -> str:
    """' (5.31 GiB after startup, the engine took 0.25 GiB)': the same comparison, short, for the verdict (no
    "; " inside: the verdict's proof is cut at those)."""
    a, g = ctx.analysis, h.gpu
    logged = a.headroom()[0] if a is not None and g is not None else None
    if logged is None or g is None or abs(logged - h.free_bytes) < SAME_FREE_BYTES:
        return ""
    if logged < h.free_bytes:
        return " ({} after startup, {} freed)".format(gib(logged), gib(h.free_bytes - logged))
    others = any(p.owner is not Owner.ENGINE and p.used_bytes for p in g.processes)
    return " ({} after startup, {} took {})".format(gib(logged), "others" if others else "the engine",
                                                           gib(logged - h.free_bytes))


# Free figures closer than this are the same reading (the log prints two decimals of GiB; NVML's free and
# CUDA's differ by a few MiB of driver bookkeeping).
SAME_FREE_BYTES = 32 << 20


def _quoted_gain(ctx: "Context", found: Spare) -> str:
    """The recommendation's own figures when the engine can size the change, else bytes ÷ bytes per token."""
    c = found.change
    per_rank = " per rank" if ctx.live is not None else ""
    if c is not None and c.gain_bytes > 0:
        return "; {} {} puts {} of it into the KV pool: +{:,} KV tokens{} (recommended below)".format(
            c.flag, c.value, gib(c.gain_bytes), c.gain_tokens, per_rank
        )
    cell = cell_bytes(ctx)
    return " ≈ {:,} more KV tokens{}".format(found.spare_bytes // cell, per_rank) if cell else ""


def _low_headroom(ctx: "Context", found: Spare, margin: int) -> Finding:
    """Less free than the margin. With evidence of pressure (``pressure``) a warning whose fix is the cut
    recommended; without it a note with what to watch: the server reached ready as sized."""
    h = found.headroom
    why, action = found.no_change
    where = "on GPU {}".format(h.gpu.index) if h.gpu is not None else "after startup"
    proof = "{} free {} < {}; {}".format(gib(h.free_bytes), where, margin_words(ctx.options),
                                         h.how if h.gpu is None else "NVML")
    flag = budget_flag(ctx)
    if found.pressure:
        return Finding(
            code="low_headroom", severity="warning",
            title="Only {} free {}, below the {} margin, and memory runs short".format(gib(h.free_bytes), where,
                                                                                      gib(margin)),
            detail="{}; {}. Out-of-memory errors under load are likely; {}.".format(
                h.how, found.pressure, why or "give memory back with a lower " + flag),
            bytes=h.free_bytes, evidence=(h.evidence,), proof=proof + "; " + found.pressure, action=action)
    seen = "one look at NVML" if h.gpu is not None and not h.measured else "the startup log"
    return Finding(
        code="low_headroom", severity="info",
        title="{} free {}: below the {} margin; watch it, no cut is advised".format(gib(h.free_bytes), where,
                                                                                    gib(margin)),
        detail="{} free {} ({}). Runtime activations (a prefill chunk, sampling, allocator fragments) come out of "
        "this, but the server reached ready as sized, and {} shows no memory pressure (no out-of-memory error, no "
        "low-water mark below the margin over a recorded history), so its KV budget is not cut on that alone{}.".format(
            gib(h.free_bytes), where, h.how, seen, "; " + why if why else ""),
        bytes=h.free_bytes, evidence=(h.evidence,), proof=proof,
        action=action or WATCH_ACTION.format(flag))


# What a thin headroom with no evidence of pressure asks of the operator (the verdict's action).
WATCH_ACTION = "watch the low-water mark with `kvforensics record`; lower {} only on an OOM or a dip under the " \
    "margin"


def rank_imbalance(ctx: "Context") -> Iterator[Finding]:
    """Ranks are sized from the least free one: a spread leaves memory unused on the others."""
    if ctx.live is not None:
        yield from _live_imbalance(ctx, ctx.live)
    elif ctx.analysis is not None:
        model = engine_model(ctx)
        if model is not None and model.log_imbalance is not None:
            yield from model.log_imbalance(ctx)


def _live_imbalance(ctx: "Context", insp: Inspection) -> Iterator[Finding]:
    gpus = [g for g in insp.engine_gpus if g.free_bytes is not None]
    if len(gpus) < 2:
        return
    # An engine that sizes every rank from the least free memory loses to whoever holds it. One whose
    # budget is a share of the total whatever else runs: only its own workers' spread (free + other
    # processes) leaves memory unused.
    model = engine_model(ctx)
    beside = model is not None and model.budget_of_total

    def free(g: GpuLedger) -> int:
        return (g.free_bytes or 0) + (
            sum(p.used_bytes or 0 for p in g.processes if p.owner is not Owner.ENGINE) if beside else 0
        )

    lo = min(gpus, key=free)
    hi = max(gpus, key=free)
    spread = free(hi) - free(lo)
    if spread < IMBALANCE_WARN_BYTES:
        return
    cell = cell_bytes(ctx)
    cost = " ≈ {:,} tokens".format(spread // cell) if cell else ""
    yield Finding(
        code="rank_imbalance",
        severity="warning",
        title="Free memory differs by {} across the engine's GPUs".format(gib(spread)),
        detail="GPU {} ({}) has {} {}, GPU {} ({}) {}. Ranks are sized from the minimum, so the others leave up "
        "to {}{} each unused.".format(
            lo.index,
            lo.rank,
            gib(free(lo)),
            "free or held by other processes" if beside else "free",
            hi.index,
            hi.rank,
            gib(free(hi)),
            gib(spread),
            cost,
        ),
        bytes=spread,
        evidence=("nvmlDeviceGetMemoryInfo_v2 free, GPUs {} and {}".format(lo.index, hi.index),),
    )


def concurrency_bound(ctx: "Context") -> Iterator[Finding]:
    """What limits concurrent requests: KV tokens or request slots (live: with the engine's load)."""
    a = ctx.analysis
    if a is None:
        return
    s = a.summary
    if s.max_total_num_tokens is None or s.context_len is None or s.max_running_requests is None:
        return
    t, c, r, n = s.max_total_num_tokens, s.context_len, s.max_running_requests, ctx.options.request_tokens
    full = t // c
    at_n = t // n
    if at_n < r:
        bound = "KV tokens"
        title = (
            "KV tokens bound concurrency: {:,} tokens hold {:,} requests of {:,} tokens, below the {:,} request slots"
        ).format(t, at_n, n, r)
    else:
        bound = "request slots"
        title = (
            "Request slots bound concurrency: max_running_requests {:,} < {:,} requests of {:,} tokens the "
            "KV pool holds"
        ).format(r, at_n, n)
    detail = (
        "max_total_num_tokens {:,}, max_running_requests {:,}, context_len {:,} ({}). At context_len, "
        "{} full-length request(s) fit at once{}; at {:,} tokens per request (--request-tokens), {:,}. "
        "Bound: {}."
    ).format(t, r, c, s.source, full, " — not even one" if full == 0 else "", n, min(r, at_n), bound)
    sev = "warning" if full == 0 or bound == "KV tokens" else "info"
    yield Finding(code="concurrency_bound", severity=sev, title=title, detail=detail, evidence=(s.source,))


def with_live_load(ctx: "Context", base: Finding) -> Finding:
    """A concurrency finding with the engine's load now; requests waiting make it a warning."""
    if ctx.live is None:
        return base
    http = ctx.live.snapshot.http
    metrics = http.metrics
    model = engine_model(ctx)
    if model is None:
        return base
    live = ["{} {}".format(label, fmt.format(metrics[key])) for key, label, fmt in model.load.shown if key in metrics]
    if not live:
        return base
    url = http.url
    queued = metrics.get(model.load.queued, 0)
    sev = "warning" if queued > 0 or base.severity == "warning" else "info"
    return replace(
        base,
        severity=sev,
        detail=base.detail + " Live ({}{}): {}.".format(url, http.metrics_path, ", ".join(live)),
        evidence=base.evidence + ("{}{}".format(url, http.metrics_path),),
    )


# --- processes (live only) -----------------------------------------------------------------


def foreign_gpu_process(ctx: "Context") -> Iterator[Finding]:
    insp = ctx.live
    if insp is None:
        return
    cell = cell_bytes(ctx)
    engine_gpus = {g.index for g in insp.engine_gpus}
    for g in insp.gpus:
        for p in g.processes:
            if p.owner is not Owner.FOREIGN or not p.used_bytes:
                continue
            on_engine = g.index in engine_gpus
            model = engine_model(ctx)
            cost = model.foreign_cost(ctx, p, len(engine_gpus), cell) if on_engine and model is not None else ""
            who = ", ".join(x for x in ("user " + p.user if p.user else "", p.container or "") if x)
            yield Finding(
                code="foreign_gpu_process",
                severity="warning" if on_engine else "info",
                title="PID {} ({}) holds {} on GPU {}{}".format(
                    p.pid,
                    p.name,
                    gib(p.used_bytes),
                    g.index,
                    ", beside engine rank " + g.rank if on_engine and g.rank else "",
                ),
                detail="{}A process that is not this engine's uses GPU memory.{}".format(
                    who + ". " if who else "", cost
                ),
                bytes=p.used_bytes,
                evidence=(
                    "nvmlDeviceGetComputeRunningProcesses(GPU {})".format(g.index),
                    "/proc/{}/cmdline".format(p.pid),
                ),
            )


def orphaned_gpu_memory(ctx: "Context") -> Iterator[Finding]:
    for g in ctx.live.gpus if ctx.live else ():
        for p in g.processes:
            if p.owner is Owner.ORPHANED:
                yield Finding(
                    code="orphaned_gpu_memory",
                    severity="error",
                    title="{} on GPU {} is held by PID {}, which does not exist".format(
                        gib(p.used_bytes) if p.used_bytes is not None else "memory", g.index, p.pid
                    ),
                    detail="NVML still charges memory to a process /proc does not have: a leaked CUDA context "
                    "(find holders with `lsof /dev/nvidia*`), or a process in another PID namespace "
                    "when kvforensics runs inside a container.",
                    bytes=p.used_bytes,
                    evidence=("nvmlDeviceGetComputeRunningProcesses(GPU {})".format(g.index), "/proc/{}".format(p.pid)),
                    proof="NVML charges {} on GPU {} to PID {}; /proc/{} does not exist".format(
                        gib(p.used_bytes), g.index, p.pid, p.pid
                    ),
                    action="find the holder with `lsof /dev/nvidia*` and end it (or reboot)",
                )


def other_pid_namespace(ctx: "Context") -> Iterator[Finding]:
    """kvforensics runs in a container: NVML's host PIDs are not in its /proc. That is not a leak."""
    insp = ctx.live
    held = [(g, p) for g in (insp.gpus if insp else ()) for p in g.processes if p.owner is Owner.OTHER_NAMESPACE]
    if not held:
        return
    gpus = sorted({g.index for g, _ in held})
    total = sum(p.used_bytes or 0 for _, p in held)
    yield Finding(
        code="pid_namespace",
        severity="info",
        title="{} GPU process(es) holding {} are in another PID namespace".format(len(held), gib(total)),
        detail="kvforensics runs in a PID namespace of its own (a container) and NVML reports host PIDs, which "
        "its /proc cannot show: they are not leaks. On GPU(s) {} their memory is counted as one item; to "
        "split it by process and map ranks, run kvforensics on the host (or with the host's PID namespace, "
        "e.g. docker --pid=host).".format(", ".join(map(str, gpus))),
        bytes=total,
        evidence=("/proc/self/ns/pid",),
    )


def other_engines(ctx: "Context") -> Iterator[Finding]:
    insp = ctx.live
    servers = [e for e in (insp.other_engines if insp else ()) if e.server is not None]
    if insp is None or not servers:
        return
    parts: List[str] = []
    for e in servers:
        pids = set(e.pids)
        gpus = sorted({g.index for g in insp.gpus for p in g.processes if p.pid in pids})
        model = e.server_args.get("model_path") or e.server_args.get("model") or "?"
        parts.append(
            "{} on port {}{} ({}, {} worker process(es), on GPU {})".format(
                display(e.kind, e.kind), e.port, "" if e.pod is None else " in pod {}/{}".format(
                    e.pod.namespace, e.pod.name), model, len(e.workers), ",".join(map(str, gpus)) or "none"
            )
        )
    # In pods, a port may be every pod's: the pod names one (collectors/selection.py).
    how = "PORT" if all(e.pod is None for e in servers) else "NAMESPACE/POD[:PORT], e.g. --engine {}".format(
        _selector(servers[0]))
    yield Finding(
        code="other_engines",
        severity="info",
        title="{} more inference server(s) on this node".format(len(servers)),
        detail="Explained here: {}. Also running: {}. Inspect another with --engine {}.".format(
            insp.engine or "none", "; ".join(parts), how
        ),
        evidence=("/proc/*/cmdline",),
    )
