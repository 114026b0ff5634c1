"""From one startup's events to the full analysis: ledgers, budget, findings, recommendations.

Pure: no I/O. ``build_analysis`` is what ``kvforensics analyze`` runs after reading the log, and
what ``inspect`` runs on the log excerpt a probe brings back; the rule book then adds findings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from kvforensics.agent.model import flags
from kvforensics.agent.model.citing import and_list, where
from kvforensics.agent.model.records import Finding, KvChange, Options, Problem, Recommendation, Verdict
from kvforensics.agent.sglang import budget as budget_mod
from kvforensics.agent.sglang import era as era_mod
from kvforensics.agent.sglang import stages
from kvforensics.agent.sglang.attribution import Attributed, attribute, pool_key
from kvforensics.agent.sglang.budget import Budget, ReqToToken
from kvforensics.agent.sglang.kv_geometry import MLA_WIDTH, GeometryError, KvGeometry, geometry, mla_layers_from_pool
from kvforensics.agent.sglang.ledger import RankLedger, ledgers
from kvforensics.agent.sglang.stages import Failure, Progress
from kvforensics.collectors.events import LogEvent
from kvforensics.collectors.sglang.startups import Startup
from kvforensics.collectors.units import gib


@dataclass(frozen=True)
class Summary:
    """The scheduler summary line (``max_total_num_tokens=…``), or None fields if absent."""

    max_total_num_tokens: Optional[int]
    max_running_requests: Optional[int]
    context_len: Optional[int]
    chunked_prefill_size: Optional[int]
    startup_avail_bytes: Optional[int]  # available_gpu_mem: free after everything (0.4.7+)
    source: str


@dataclass(frozen=True)
class Analysis:
    """One SGLang startup analysed: its era, server args, per-rank ledgers, KV budget and failure, then the rule book's
    findings, recommendations and verdict."""

    target: str
    status: str  # "ok" | "partial"
    problems: Tuple[Problem, ...]
    era: era_mod.Era
    server_args: Dict[str, Any]
    server_args_source: str
    startup_index: Optional[int]
    startup_count: Optional[int]
    startup_first_line: Optional[int]
    summary: Summary
    ranks: Tuple[RankLedger, ...]
    budget: Budget
    geometry: Optional[KvGeometry]
    req_to_token: Optional[ReqToToken]
    attributed: Attributed
    options: Options
    progress: Progress = Progress((), None, None, False)
    failure: Optional[Failure] = None
    findings: Tuple[Finding, ...] = ()
    recommendations: Tuple[Recommendation, ...] = ()
    verdict: Optional[Verdict] = None  # the answer first, from the findings and recommendations
    engine: str = "sglang"  # its plug-in's name (agent/plugin.py EngineAnalysis)

    @property
    def tp_size(self) -> int:
        value = self.server_args.get("tp_size")
        return value if isinstance(value, int) and value > 0 else max(1, len(self.ranks))

    @property
    def page_size(self) -> int:
        value = self.server_args.get("page_size")
        return value if isinstance(value, int) and value > 0 else 1

    @property
    def complete(self) -> bool:
        """The startup reached its scheduler summary: figures after it are "after startup"."""
        return self.progress.complete

    def headroom(self) -> Tuple[Optional[int], str]:
        """Free memory after startup: the summary's available_gpu_mem, else the least of the ranks'
        last figures — only when the startup finished (a fragment's last figure precedes later
        consumers: graphs, the draft, the crash)."""
        if not self.complete:
            return None, ""
        if self.summary.startup_avail_bytes is not None:
            return self.summary.startup_avail_bytes, self.summary.source + ": available_gpu_mem"
        finals = [(r.final_avail_bytes, r) for r in self.ranks if r.final_avail_bytes is not None]
        if not finals:
            return None, ""
        value, r = min(finals, key=lambda x: x[0])
        return value, "{} {}: last free figure".format(r.rank, r.sources.get("final_avail_bytes", "")).strip()

    def memory_pressure(self) -> str:
        """The log's evidence that memory runs short while serving: an out-of-memory error after the scheduler
        summary (the startup had finished), for node_rules.pressure; '' when it shows none."""
        if not self.complete or not self.attributed.summaries:
            return ""
        ready = self.attributed.summaries[0]
        lines = [e for e in self.attributed.failures + self.attributed.other if e.kind in ("failure", "exception")]
        oom = next((e for e in lines if (e.offset, e.line or 0) > (ready.offset, ready.line or 0)
                    and (e.data.get("cause") == "cuda_out_of_memory" or "out of memory" in e.text.lower())), None)
        return "" if oom is None else "the log shows an out-of-memory error while serving ({})".format(where(oom))

    def last_free_seen(self) -> Tuple[Optional[int], str]:
        """The least of the ranks' last free figures, whatever stage it came from, with its line."""
        finals = [(r.final_avail_bytes, r) for r in self.ranks if r.final_avail_bytes is not None]
        if not finals:
            return None, ""
        value, r = min(finals, key=lambda x: x[0])
        return value, "{} {}".format(r.rank, r.sources.get("final_avail_bytes", "")).strip()

    def kv_change(self, delta_bytes: int, cuda_total: Optional[int] = None,
                  flags: Optional[Dict[str, Any]] = None) -> Optional[KvChange]:
        """The --mem-fraction-static that moves every rank's KV pool by at most ``delta_bytes``
        (negative: gives memory back), with what it really moves; None without the budget's inputs, when
        the fraction would reach 1 (a live node whose free memory the log's budget cannot explain), or when
        a cut would leave no KV budget (``why_no_kv_change`` says which). The fraction multiplies the free
        memory before the weights load, so the GPU's total and the live flags size nothing here."""
        b = self.budget
        if b.mfs is None or not b.pre_min_bytes or not b.cell_bytes:
            return None
        new, gain, tokens = budget_mod.mem_fraction_change(b, delta_bytes)
        if new >= 1:  # more spare than the whole reserve: the log does not describe this node's memory now
            return None
        if new <= max(0.0, self._no_kv_fraction() or 0.0):  # the flag is a fraction in (0, 1) that leaves a pool
            return None
        return KvChange(flag="--mem-fraction-static", value="{:.3f}".format(new), gain_bytes=gain, gain_tokens=tokens,
                        rounding=budget_mod.MFS_ROUNDING)

    def _no_kv_fraction(self) -> Optional[float]:
        """The --mem-fraction-static at or below which the KV budget is ≤ 0: rest = post − pre × (1 − f)
        (model_runner.py profile_max_num_token), so f ≤ 1 − post/pre leaves nothing for the pool."""
        b = self.budget
        return 1 - b.post_min_bytes / b.pre_min_bytes if b.pre_min_bytes and b.post_min_bytes else None

    def why_no_kv_change(self, delta_bytes: int, live: bool, cuda_total: Optional[int] = None,
                         flags: Optional[Dict[str, Any]] = None) -> Tuple[str, str]:
        """(why, action) when ``kv_change(delta_bytes)`` gives no --mem-fraction-static; ("", "") when it gives one."""
        b, margin, flag = self.budget, self.options.margin_bytes, "--mem-fraction-static"
        if self.kv_change(delta_bytes) is not None:
            return "", ""
        if delta_bytes < 0 and b.pre_min_bytes and margin >= b.pre_min_bytes:
            return ("no {} keeps the {} margin: it is more than the {} the GPU had free before the weights "
                    "loaded".format(flag, gib(margin), gib(b.pre_min_bytes)),
                    "none: the {} margin exceeds the GPU ({} free before loading); check --margin".format(
                        gib(margin), gib(b.pre_min_bytes)))
        floor = self._no_kv_fraction()
        if delta_bytes < 0 and b.mfs is not None and floor is not None and b.pre_min_bytes and b.cell_bytes:
            return ("no {} keeps the {} margin: giving back {} would leave no KV budget (it is {})".format(
                        flag, gib(margin), gib(-delta_bytes), gib(int((b.mfs - floor) * b.pre_min_bytes))),
                    "none: no {} keeps a {} margin and a KV pool; use more GPUs (--tp-size) or check "
                    "--margin".format(flag, gib(margin)))
        lacks = [what for what, known in (("mem_fraction_static", b.mfs is not None),
                                          ("the free memory before the weights load", bool(b.pre_min_bytes)),
                                          ("the KV bytes per token", bool(b.cell_bytes))) if not known]
        if not lacks:
            return "", ""
        change = "a {} raise".format(flag) if delta_bytes > 0 else "a lower {}".format(flag)
        paste = "pass the whole startup with --log" if live else \
            "paste the startup from `server_args=` to the `max_total_num_tokens=` line, or run `kvforensics inspect`"
        return ("this log cannot size {} (it lacks {})".format(change, and_list(lacks)),
                "this log cannot size {}: {}".format("a raise" if delta_bytes > 0 else "a cut", paste))

    def engine_warnings(self, kind: str) -> List[Tuple[str, str]]:
        """(text, evidence) of SGLang's own warnings of one kind ("unbalanced", …)."""
        return [(e.text, where(e)) for e in self.attributed.other if e.kind == kind]

    @property
    def failed(self) -> Optional[Failure]:
        """The startup failure, if the startup failed before its summary line."""
        return self.failure


def _summary(attributed: Attributed) -> Summary:
    if not attributed.summaries:
        return Summary(max_total_num_tokens=None, max_running_requests=None, context_len=None,
                       chunked_prefill_size=None, startup_avail_bytes=None, source="")
    # With DP, every replica (or only DP0 under DP-attention) prints one; they agree in
    # practice, and /server_info reports DP rank 0's — so take the first.
    s = attributed.summaries[0]
    d = s.data
    return Summary(max_total_num_tokens=d["max_total_num_tokens"], max_running_requests=d["max_running_requests"],
                   context_len=d["context_len"], chunked_prefill_size=d["chunked_prefill_size"],
                   startup_avail_bytes=d["avail_bytes"], source=where(s))


def _geometry(opts: Options, args: Dict[str, Any], kv_dtype: Optional[str],
              problems: List[Problem], era: era_mod.Era) -> Optional[KvGeometry]:
    if opts.model_config is None:
        return None
    tp = args.get("tp_size") if isinstance(args.get("tp_size"), int) and args["tp_size"] > 0 else 1
    dp = args.get("dp_size") if isinstance(args.get("dp_size"), int) and args["dp_size"] > 0 else 1
    attn_tp = max(1, tp // dp) if args.get("enable_dp_attention") else tp
    dtype = args.get("kv_cache_dtype") or (kv_dtype or "").replace("torch.", "") or None
    try:
        pp = args.get("pp_size") if isinstance(args.get("pp_size"), int) and args["pp_size"] > 0 else 1
        backend = args.get("nsa_decode_backend") or args.get("nsa_prefill_backend")
        return geometry(opts.model_config, attn_tp=attn_tp, kv_cache_dtype=dtype, era=era,
                        nsa_backend=str(backend) if backend else None, pp_size=pp)
    except GeometryError as exc:
        problems.append(Problem("model_config.unusable", "{}: {}".format(opts.model_config_path, exc)))
        return None


def build_analysis(startup: Startup, target: str, opts: Options, index: Optional[int] = None,
                   count: Optional[int] = None, reader_notes: Tuple[str, ...] = (),
                   fallback_args: Optional[Dict[str, Any]] = None) -> Analysis:
    """The startup's ledgers and budget, without findings (``agent/model/analyze.py`` adds those).

    ``fallback_args``: flags from the live command line, used where the log has no server_args."""
    problems: List[Problem] = [Problem("log.reader", note) for note in reader_notes]
    attributed = attribute(startup)
    era = era_mod.detect(startup)
    args_ev = attributed.server_args
    args = _server_args(args_ev, fallback_args, problems)
    summary = _summary(attributed)
    page = args.get("page_size") if isinstance(args.get("page_size"), int) and args["page_size"] > 0 else 1
    kv_dtype = next((e.data["dtype"] for e in attributed.other if e.kind == "kv_dtype"), None)
    geo = _geometry(opts, args, kv_dtype, problems, era)
    mm = sum(e.data["bytes"] for e in attributed.other if e.kind == "mm_reserve")
    bud = _budget(era, attributed, args, page, geo, mm, summary)
    rtt = _req_to_token(era, args, summary, bud)
    ranks = ledgers(attributed, page, bud.reserve_bytes, _reserve_source(bud), rtt.bytes if rtt else None,
                    rtt.formula if rtt else "")
    prog = stages.progress(attributed)
    died = stages.failure(startup.events, attributed, prog)
    missing = _missing(attributed, summary, args_ev, died is not None)
    unknown = [e for e in startup.events if e.kind == "unrecognized"]
    problems.extend(_log_problems(attributed, missing, unknown))
    problems.extend(_swa_half_problems(attributed, ranks))
    return Analysis(target=target, status="ok" if not missing and not unknown else "partial",
                    problems=tuple(problems), era=era, server_args=args,
                    server_args_source=where(args_ev) if args_ev else "", startup_index=index, startup_count=count,
                    startup_first_line=startup.first_line, summary=summary, ranks=ranks, budget=bud, geometry=geo,
                    req_to_token=rtt, attributed=attributed, options=opts, progress=prog, failure=died)


# The flags the model and the reports read, typed first (agent/model/flags.py): a forged or corrupted
# value (a string page_size, a 400-digit max_running_requests) is unknown with a problem, not a crash.
FLAGS = {
    "page_size": flags.count(1, 1 << 20), "tp_size": flags.count(1, 1 << 16), "dp_size": flags.count(1, 1 << 16),
    "pp_size": flags.count(1, 1 << 16), "max_running_requests": flags.count(), "max_total_tokens": flags.count(),
    "speculative_num_steps": flags.count(0, 1 << 16), "speculative_eagle_topk": flags.count(0, 1 << 16),
    "speculative_num_draft_tokens": flags.count(0, 1 << 16), "cuda_graph_max_bs": flags.count(0, 1 << 20),
    "context_length": flags.count(1), "chunked_prefill_size": flags.count(-1),
    "mem_fraction_static": flags.number(0, 1), "kv_cache_dtype": flags.TEXT, "model_path": flags.TEXT,
    "model": flags.TEXT, "speculative_algorithm": flags.TEXT, "nsa_decode_backend": flags.TEXT,
    "nsa_prefill_backend": flags.TEXT, "enable_dp_attention": flags.SWITCH,
    "enable_hierarchical_cache": flags.SWITCH, "enable_hicache": flags.SWITCH,
}


def _server_args(args_ev: Optional[LogEvent], fallback_args: Optional[Dict[str, Any]],
                 problems: List[Problem]) -> Dict[str, Any]:
    """The log's server_args over the live command line's flags, each typed (FLAGS)."""
    args, dropped = flags.typed(fallback_args or {}, FLAGS, "the server's command line")
    problems.extend(dropped)
    if args_ev:
        logged, dropped = flags.typed(args_ev.data["args"], FLAGS, "server_args ({})".format(where(args_ev)))
        args.update(logged)
        problems.extend(dropped)
    return args


def _budget(era: era_mod.Era, attributed: Attributed, args: Dict[str, Any], page: int, geo: Optional[KvGeometry],
            mm: int, summary: Summary) -> Budget:
    """The KV budget from the ledgers without the reserve (the budget is what gives it), checked
    against the post-capture re-sizing when the startup did one."""
    first = ledgers(attributed, page, None, "", None, "")
    draft_first = _draft_loaded_first(attributed)
    cell_geo = geo or (_mla_from_log(attributed, page) if draft_first else None)
    cell_formula = ("--model-config: " if cell_geo is geo else "the log: ") + cell_geo.formula if cell_geo else ""
    bud = budget_mod.compute(era, budget_mod.Inputs(
        args=args, ranks=first, page_size=page, cell_from_config=cell_geo.bytes_per_token if cell_geo else None,
        cell_config_formula=cell_formula, mm_reserve=mm, draft_first=draft_first,
        mfs_origin=_mfs_origin(attributed.server_args), swa_full_tokens=_swa_full_tokens(attributed),
        context_len=summary.context_len, target_layers=cell_geo.layers if cell_geo else None,
        logged_tokens=_first_kv_tokens(attributed), summary_tokens=summary.max_total_num_tokens,
        pre_capture_kv=_pre_capture_kv(attributed)))
    resized = next((e for r in attributed.ranks for e in r.target.all("post_capture_kv")), None)
    if resized is not None:
        bud = budget_mod.post_capture_check(bud, budget_mod.Resized(
            tokens=resized.data["tokens"], kv_bytes=resized.data.get("kv_bytes"),
            avail_bytes=resized.data.get("avail_bytes"), source=where(resized),
            free_before_bytes=_free_before(attributed, resized),
            backed_before_bytes=_backed_before_capture(geo, bud.cell_bytes, page)), mm, page)
    return bud


def _mfs_origin(args_ev: Optional[LogEvent]) -> str:
    """Where mem_fraction_static comes from: the log's server_args when it gives one that its type
    (FLAGS) keeps, else the live command line."""
    logged = args_ev.data["args"] if args_ev else {}
    if "mem_fraction_static" in logged and flags.typed(
            {"mem_fraction_static": logged["mem_fraction_static"]}, FLAGS, "")[0]:
        return "server_args mem_fraction_static ({})".format(where(args_ev))
    return "the server's command line (--mem-fraction-static)"


def _swa_full_tokens(attributed: Attributed) -> Optional[int]:
    """The full-attention token count of a hybrid sliding-window pool."""
    splits = (e for e in attributed.other if e.kind == "swa_split" and e.data.get("full_tokens"))
    # Without the split line (a fragment), 'SWAKVPool mem usage …, full size: F' gives the same F.
    totals = (e for r in attributed.ranks for e in r.target.all("swa_pool") if e.data.get("full_tokens"))
    return next((e.data["full_tokens"] for e in (*splits, *totals)), None)


def _mla_from_log(attributed: Attributed, page: int) -> Optional[KvGeometry]:
    """Without --model-config, for the 0.5.14+ draft scaling: the target's MLA geometry from its own pool
    line (None for MHA, NSA, or a line without dtype or #tokens)."""
    pool = next((e for r in attributed.ranks for e in r.target.all("kv_pool")), None)
    if pool is None or pool.data.get("layout") != "single" or not pool.data.get("tokens"):
        return None
    found = mla_layers_from_pool(pool.data["kv_bytes"], pool.data["tokens"], page, pool.data.get("dtype"),
                                 budget_mod.HALF)
    if found is None:
        return None
    layers, elem = found
    return KvGeometry(kind="mla", layers=layers, bytes_per_token=MLA_WIDTH * elem * layers,
                      dtype=str(pool.data.get("dtype")), formula="(512 + 64) × {} layers × {} B, the layers from {} "
                      "(KV size / ((512 + 64) × {} B × (#tokens + page_size)))".format(layers, elem, where(pool), elem))


def _free_before(attributed: Attributed, resized: LogEvent) -> Optional[int]:
    """The free memory SGLang re-sizes from: the last 'Capture … end' avail on the rank before the re-size."""
    rank = next((r for r in attributed.ranks if resized in r.target.events), None)
    if rank is None:
        return None
    ends = [e for e in rank.target.events + rank.draft.events if e.kind == "graph_end"
            and e.data.get("avail_bytes") is not None and _order(e) < _order(resized)]
    return max(ends, key=_order).data["avail_bytes"] if ends else None


def _backed_before_capture(geo: Optional[KvGeometry], cell: Optional[int], page: int) -> Optional[int]:
    """Bytes backed before capture: one page of each K and V buffer (two per layer), each rounded up to the
    2 MiB granule (kv_vmm_backing.py KvVmmBufferOwner.__init__ ensure_prefix(page_size), 0.5.18). Only for
    a plain half-precision MHA pool, whose buffers are known from the layer count."""
    if geo is None or geo.kind != "mha" or geo.dtype not in ("bfloat16", "float16", "auto") or not cell:
        return None
    buffers = 2 * geo.layers
    row = cell // buffers
    granule = budget_mod.GRANULE
    return buffers * (-(-page * row // granule) * granule)


def _pre_capture_kv(attributed: Attributed) -> Optional[Tuple[int, int]]:
    """(#tokens, bytes) of the first rank's pre-capture pool lines, when the pool was re-sized after capture."""
    for r in attributed.ranks:
        pools = [e for e in r.target.all("kv_pool") if e.data.get("state") == "VA upper bound"]
        if r.target.has("post_capture_kv") and pools and pools[0].data.get("tokens"):
            return pools[0].data["tokens"], sum(p.data["kv_bytes"] for p in pools)
    return None


def _first_kv_tokens(attributed: Attributed) -> Optional[int]:
    """#tokens of the first full-attention KV pool line (before any post-capture re-sizing)."""
    first_kv = next((e for r in attributed.ranks for e in r.target.all("kv_pool")
                     if e.data.get("tokens") and pool_key(e, r.swa_split) != "SWA"), None)
    return first_kv.data["tokens"] if first_kv else None


def _req_to_token(era: era_mod.Era, args: Dict[str, Any], summary: Summary, bud: Budget) -> Optional[ReqToToken]:
    """The req_to_token table, sized from the summary's pool and context length (none without them)."""
    if not (summary.max_total_num_tokens and summary.context_len):
        return None
    return budget_mod.req_to_token(era, args, summary.max_total_num_tokens, summary.context_len,
                                   summary.max_running_requests, bud.profiled_tokens)


def _reserve_source(bud: Budget) -> str:
    if bud.reserve_bytes is None:
        return ""
    return "pre-load free (min over ranks) × (1 − mem_fraction_static {:g}; {})".format(bud.mfs or 0, bud.mfs_source)


def _log_problems(attributed: Attributed, missing: List[str], unknown: List[LogEvent]) -> List[Problem]:
    """What this startup's lines lack: the lines it should have, per-rank lines, shapes not known."""
    problems: List[Problem] = []
    if missing:
        problems.append(Problem("log.fragment", "not in this startup: " + ", ".join(missing)))
    if not attributed.ranks:
        problems.append(Problem("log.no_ranks", "no per-rank memory lines in this startup"))
    if unknown:
        shown = ", ".join(where(e) for e in unknown[:10]) + (" and {} more".format(len(unknown) - 10)
                                                             if len(unknown) > 10 else "")
        problems.append(Problem("log.unrecognized", "{} line(s) carry memory figures in a shape kvforensics does not "
                                "know, and were not used: {}".format(len(unknown), shown)))
    return problems


def _swa_half_problems(attributed: Attributed, ranks: Tuple[RankLedger, ...]) -> List[Problem]:
    """Ranks whose KV lines are only a hybrid pool's sliding-window half: their pool size is unknown."""
    pooled = {e.rank for e in attributed.ranks if e.target.has("kv_pool")}
    half = [r.rank or "untagged" for r in ranks if r.rank in pooled and r.target.kv_bytes is None]
    if not half:
        return []
    return [Problem("log.kv_pool_half", "{}: only the sliding-window half of the hybrid KV pool is in this log (the "
                    "full-attention half's line is not), so the KV pool's size is unknown".format(", ".join(half)))]


def _draft_loaded_first(attributed: Attributed) -> bool:
    """True when a rank's draft weights finished loading before its target KV pool line."""
    for rank in attributed.ranks:
        draft_end = rank.draft.first("load_end")
        target_kv = rank.target.first("kv_pool")
        if draft_end is not None and target_kv is not None and _order(draft_end) < _order(target_kv):
            return True
    return False


def _order(ev: LogEvent) -> Tuple[int, int]:
    return (ev.offset, ev.line or 0)


def _missing(attributed: Attributed, summary: Summary, args_ev: Optional[LogEvent], failed: bool) -> List[str]:
    need: List[str] = []
    if args_ev is None:
        need.append("server_args line")
    kinds = {e.kind for r in attributed.ranks for e in r.target.events}
    for kind, label in (("load_begin", "'Load weight begin'"), ("load_end", "'Load weight end'"),
                        ("kv_pool", "'KV Cache is allocated'"), ("pool_end", "'Memory pool end'")):
        if kind not in kinds:
            need.append(label)
    if summary.max_total_num_tokens is None and not failed:
        need.append("scheduler summary 'max_total_num_tokens='")
    return need
