"""The terminal report (rich): header, per-rank ledger, a bar per GPU, findings, recommendations.

GiB appear only here, labelled; the records underneath are bytes. Ranks whose ledgers are
identical are shown as one column ("TP0–TP7").
"""

from __future__ import annotations

import io
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from agent.live import GpuLedger, Inspection, Owner, TargetFailure
from agent.records import Finding, Recommendation, severity_rank
from agent.sglang.analysis import Analysis
from agent.sglang.ledger import RankLedger, RunnerLedger
from agent.sglang.rules import reserve_breakdown
from collectors.units import GIB
from reports.labels import ITEM_COLOURS, ITEM_LABELS

SEVERITY_STYLE = {"critical": "bold white on red", "error": "bold red", "warning": "yellow", "info": "cyan"}

# (label, getter, source key, colour for the bar or None)
Row = Tuple[str, Callable[[RankLedger], Optional[int]], str, Optional[str]]


def _t(attr: str) -> Callable[[RankLedger], Optional[int]]:
    return lambda r: getattr(r.target, attr)


def _d(attr: str) -> Callable[[RankLedger], Optional[int]]:
    return lambda r: getattr(r.draft, attr) if r.draft is not None else None


LEDGER_ROWS: Sequence[Row] = (
    ("distributed init (before load)", _t("dist_init_bytes"), "dist_init_bytes", None),
    ("free before weights load", _t("pre_load_avail_bytes"), "pre_load_avail_bytes", None),
    ("weights", _t("weights_bytes"), "weights_bytes", "blue"),
    ("KV pool", _t("kv_bytes"), "kv_bytes", "green"),
    ("Mamba state", _t("mamba_bytes"), "mamba_bytes", "green4"),
    ("req_to_token table (computed)", lambda r: r.req_to_token_bytes, "req_to_token_bytes", "grey50"),
    ("attention workspaces", _t("workspace_bytes"), "workspace_bytes", "grey62"),
    ("CUDA graphs", _t("graph_bytes"), "graph_bytes", "magenta"),
    ("draft weights", _d("weights_bytes"), "draft.weights_bytes", "dark_orange"),
    ("draft KV pool", _d("kv_bytes"), "draft.kv_bytes", "orange3"),
    ("draft CUDA graphs", _d("graph_bytes"), "draft.graph_bytes", "orange1"),
    ("unexplained", lambda r: r.unexplained_bytes, "unexplained_bytes", "red"),
    ("free after startup", lambda r: r.final_avail_bytes, "final_avail_bytes", "white"),
)


def console(color: bool, width: int) -> Tuple[io.StringIO, "object"]:
    """A rich console writing into a buffer (renderers return text; the CLI prints it)."""
    from rich.console import Console

    buf = io.StringIO()
    return buf, Console(file=buf, width=width, force_terminal=color, no_color=not color,
                        color_system="truecolor" if color else None, highlight=False, emoji=False)


def text_of(buf: io.StringIO) -> str:
    # rich pads every line to the console width; trailing blanks only hurt copy-paste
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def _cells(segments: Sequence[Tuple[str, int, str]], total: int, width: int) -> List[Tuple[str, int, str]]:
    """(label, bytes, colour) -> (label, cells, colour) across ``width`` cells for ``total`` bytes."""
    out, used = [], 0
    for label, value, colour in segments:
        cells = min(int(round(value / total * width)), width - used)
        if cells > 0:
            out.append((label, cells, colour))
            used += cells
    return out


def _gib(n: Optional[int]) -> str:
    return "—" if n is None else "{:.2f}".format(n / GIB)


def _key(r: RankLedger) -> Tuple:
    def runner(x: Optional[RunnerLedger]) -> Tuple:
        if x is None:
            return ()
        return tuple(getattr(x, k) for k in x.__dataclass_fields__ if k != "sources")
    return (runner(r.target), runner(r.draft), r.reserve_bytes, r.req_to_token_bytes,
            r.final_avail_bytes, r.unexplained_bytes)


def collapse(ranks: Sequence[RankLedger]) -> List[Tuple[str, RankLedger]]:
    """Group ranks with identical ledgers: [("TP0–TP7", ledger), ...]."""
    groups: Dict[Tuple, List[RankLedger]] = {}
    for r in ranks:
        groups.setdefault(_key(r), []).append(r)
    out = []
    for members in groups.values():
        names = [m.rank or "(untagged)" for m in members]
        label = names[0] if len(names) == 1 else "{}–{}".format(names[0], names[-1]) \
            if _contiguous(names) else ",".join(names)
        out.append((label, members[0]))
    return out


def _contiguous(names: List[str]) -> bool:
    try:
        nums = [int(n.rsplit("TP", 1)[1]) for n in names]
        prefixes = {n.rsplit("TP", 1)[0] for n in names}
    except (IndexError, ValueError):
        return False
    return len(prefixes) == 1 and nums == list(range(nums[0], nums[0] + len(nums)))


def _source(r: RankLedger, key: str) -> str:
    if key.startswith("draft."):
        return r.draft.sources.get(key[6:], "") if r.draft else ""
    return r.sources.get(key) or r.target.sources.get(key, "")


def bar(r: RankLedger, width: int = 60) -> List[Tuple[str, int, str]]:
    """Segments (label, cells, colour) across the memory that was free before loading."""
    total = (r.target.pre_load_avail_bytes or 0)
    if total <= 0:
        return []
    segments = []
    for label, get, _, colour in LEDGER_ROWS:
        value = get(r)
        if colour is None or not value or value <= 0:
            continue
        segments.append((label, value, colour))
    return _cells(segments, total, width)


def _render_each(items: Sequence[Any], one: Callable[[Any, Any], None], color: bool, width: int) -> str:
    """Render every item with ``one(console, item)``, a rule between them."""
    buf, c = console(color, width)
    for i, item in enumerate(items):
        if i:
            c.rule()  # type: ignore[attr-defined]
        one(c, item)
    return text_of(buf)


def render(analyses: Sequence[Analysis], color: bool = True, width: int = 110) -> str:
    return _render_each(analyses, _render_one, color, width)


def _render_one(console: "object", a: Analysis, live: bool = False) -> None:
    """The log analysis; with ``live`` the findings and recommendations come from the caller."""
    if getattr(a, "engine", "sglang") == "vllm":
        _render_vllm(console, a, live)
        return
    _header(console, a, live)
    groups = collapse(a.ranks)
    if groups:
        _ledger_table(console, a, groups)
        _bars(console, groups)
    _reserve_table(console, a)
    if not live:
        _findings(console, a.findings)
        _recommendations(console, a.recommendations, a.summary.context_len, a.options.request_tokens)


def _header(c: "object", a: Analysis, live: bool) -> None:
    from rich.padding import Padding
    from rich.text import Text

    args = a.server_args
    head = Text()
    if not live:
        head.append("kvforensics ", style="bold")
        head.append(a.target, style="bold cyan")
        head.append("  ")
    head.append("SGLang {} (from line formats)".format(a.era.hint))
    c.print(head)  # type: ignore[attr-defined]
    facts = []
    if args.get("model_path"):
        facts.append("model {}".format(args["model_path"]))
    tp = args.get("tp_size")
    facts.append("{} rank(s){}".format(len(a.ranks), ", TP{}".format(tp) if tp else ""))
    if a.budget.mfs is not None:
        facts.append("mem_fraction_static {:g}{}".format(
            a.budget.mfs, "" if a.server_args_source else " (back-solved)"))
    if args.get("speculative_algorithm"):
        facts.append("speculative {}".format(args["speculative_algorithm"]))
    idx = "startup {} of {}".format(a.startup_index, a.startup_count) if a.startup_count \
        else "last startup (earlier ones not counted)"
    facts.append("{} (line {})".format(idx, a.startup_first_line) if a.startup_first_line else idx)
    c.print(Padding(Text(" · ".join(facts)), (0, 0, 0, 2), expand=False))  # type: ignore[attr-defined]
    s = a.summary
    if s.max_total_num_tokens is not None:
        c.print("  KV tokens {:,} · max_running_requests {} · context_len {} · free after startup {} GiB "  # type: ignore[attr-defined]
                "({})".format(s.max_total_num_tokens, _count(s.max_running_requests), _count(s.context_len),
                              _gib(s.startup_avail_bytes), s.source))
    for p in a.problems:
        c.print(Text("  ! {}: {}".format(p.code, p.message), style="yellow"))  # type: ignore[attr-defined]


_VLLM_COLUMNS = (("total", "total_gpu_bytes"), ("budget T·u", "requested_bytes"), ("weights", "weights_bytes"),
                 ("non-torch", "non_torch_bytes"), ("activation", "activation_peak_bytes"),
                 ("graphs", "cuda_graph_bytes"), ("KV", "available_kv_bytes"))


def _render_vllm(c: "object", a: Any, live: bool) -> None:
    """A vLLM analysis: header, a per-worker ledger (GiB, — where the log has no figure), findings."""
    from rich.table import Table
    from rich.text import Text

    head = Text()
    if not live:
        head.append("kvforensics ", style="bold")
        head.append(a.target, style="bold cyan")
        head.append("  ")
    head.append("vLLM {} (from line formats{})".format(a.era.hint or "?", ", era " + a.era.name if a.era.name else ""))
    c.print(head)  # type: ignore[attr-defined]
    facts = ["{} worker(s)".format(len(a.ranks))]
    if a.kv_cache_tokens is not None:
        facts.append("GPU KV cache {:,} tokens".format(a.kv_cache_tokens))
    if a.gpu_blocks is not None:
        facts.append("{:,} GPU blocks".format(a.gpu_blocks))
    if a.max_concurrency:
        facts.append("max concurrency {:.2f}x at {:,} tokens".format(a.max_concurrency["times"],
                                                                     a.max_concurrency["tokens_per_request"]))
    c.print("  " + " · ".join(facts))  # type: ignore[attr-defined]
    for p in a.problems:
        c.print(Text("  ! {}: {}".format(p.code, p.message), style="yellow"))  # type: ignore[attr-defined]
    if a.ranks:
        table = Table(show_edge=False, pad_edge=False)
        table.add_column("worker")
        table.add_column("u", justify="right")
        for label, _ in _VLLM_COLUMNS:
            table.add_column(label, justify="right")
        for w in a.ranks:
            u = w.gpu_memory_utilization
            table.add_row(w.rank or "(no prefix)", "—" if u is None else "{:g}".format(u),
                          *[_gib(getattr(w, key)) for _, key in _VLLM_COLUMNS])
        c.print(table)  # type: ignore[attr-defined]
    if not live:
        _findings(c, a.findings)
        _recommendations(c, a.recommendations, a.max_model_len, a.options.request_tokens)


def _count(n: Optional[int]) -> str:
    return "—" if n is None else "{:,}".format(n)


def _ledger_table(c: "object", a: Analysis, groups: List[Tuple[str, RankLedger]]) -> None:
    from rich.table import Table

    table = Table(title="Memory ledger per rank (GiB; 1 GiB = 2^30 B; SGLang's \"GB\" is GiB)",
                  title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("item")
    for label, _ in groups:
        table.add_column(label, justify="right")
    table.add_column("source ({})".format(groups[0][0]), overflow="fold", max_width=52, style="dim")
    for label, get, key, _ in LEDGER_ROWS:
        values = [get(r) for _, r in groups]
        if all(v is None for v in values):
            continue
        if key == "final_avail_bytes" and not a.complete:  # a fragment's last figure is not "after startup"
            label = "last free figure seen"
        table.add_row(label, *[_gib(v) for v in values], _source(groups[0][1], key))
    r0 = groups[0][1]
    if r0.target.kv_tokens is not None:
        table.add_row("KV tokens", *[_count(r.target.kv_tokens) for _, r in groups],
                      r0.target.sources.get("kv_tokens", ""))
    if a.budget.cell_bytes:
        table.add_row("KV bytes per token", *["{:,}".format(a.budget.cell_bytes) for _ in groups],
                      a.budget.cell_source)
    if r0.reserve_bytes is not None:
        table.add_row("reserve (1 − mfs) × pre-load free", *[_gib(r.reserve_bytes) for _, r in groups],
                      "formula: " + a.budget.mfs_source)
    c.print(table)  # type: ignore[attr-defined]


def _bars(c: "object", groups: List[Tuple[str, RankLedger]]) -> None:
    from rich.text import Text

    c.print(Text("Where each GPU's pre-load free memory went:", style="bold"))  # type: ignore[attr-defined]
    for label, r in groups:
        line = Text("  {:>9} ".format(label[:9]))
        segs = bar(r)
        for _, cells, colour in segs:
            line.append("█" * cells, style=colour)
        line.append("░" * (60 - sum(x[1] for x in segs)), style="dim")
        line.append(" {} GiB".format(_gib(r.target.pre_load_avail_bytes)))
        c.print(line)  # type: ignore[attr-defined]
    legend = Text("  ")
    for label, _, _, colour in LEDGER_ROWS:
        if colour and any(name == label for name, _, _ in bar(groups[0][1])):
            legend.append("█ ", style=colour)
            legend.append(label + "  ")
    c.print(legend)  # type: ignore[attr-defined]


def _reserve_table(c: "object", a: Analysis) -> None:
    from rich.table import Table

    rows = reserve_breakdown(a) if a.complete else []
    if not rows or not a.budget.reserve_bytes:
        return
    table = Table(title="Where the {} GiB reserve went (rank with the least free memory)".format(
        _gib(a.budget.reserve_bytes)), title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("GiB", justify="right")
    table.add_column("item")
    table.add_column("source", style="dim", overflow="fold")
    for name, n, src in rows:
        table.add_row(_gib(n), name, src)
    c.print(table)  # type: ignore[attr-defined]


def _findings(c: "object", findings: Sequence["Finding"]) -> None:
    from rich.padding import Padding
    from rich.text import Text

    shown = [f for f in findings if f.code != "reserve_breakdown"]  # shown as its own table
    if not shown:
        return
    c.print(Text("Findings", style="bold underline"))  # type: ignore[attr-defined]
    for f in shown:
        t = Text()
        t.append("{:<8}".format(f.severity.upper()), style=SEVERITY_STYLE[f.severity])
        t.append(" {}: ".format(f.code), style="bold")
        t.append(f.title)
        c.print(t)  # type: ignore[attr-defined]
        c.print(Padding(Text(f.detail), (0, 0, 0, 9), expand=False))  # type: ignore[attr-defined]
        if f.evidence:
            c.print(Padding(Text("evidence: " + "; ".join(f.evidence), style="dim"), (0, 0, 0, 9),
                            expand=False))  # type: ignore[attr-defined]


def _recommendations(c: "object", recs: Sequence["Recommendation"], context_len: Optional[int],
                     request_tokens: int) -> None:
    from rich.padding import Padding
    from rich.text import Text

    if not recs:
        return
    c.print(Text("Recommendations (per rank; requests = more concurrent requests at context_len "
                 ""  # type: ignore[attr-defined]
                 "{:,} / at {:,} tokens)".format(context_len or 0, request_tokens), style="bold underline"))
    for r in recs:
        t = Text("→ ")
        t.append("{} {}".format(r.flag, r.value), style="bold green")
        gains = []
        if r.gain_bytes is not None:
            gains.append("{:+.2f} GiB".format(r.gain_bytes / GIB))
        if r.gain_tokens is not None:
            gains.append("{:+,} tokens".format(r.gain_tokens))
        req = r.gain_requests
        if req:
            gains.append("{} / {} requests".format(_plus(req.get("at_context_len")),
                                                   _plus(req.get("at_request_tokens"))))
        t.append("   " + ", ".join(gains))
        t.append("   [{}]".format(r.basis), style="dim")
        c.print(t)  # type: ignore[attr-defined]
        c.print(Padding(Text(r.rationale), (0, 0, 0, 2), expand=False))  # type: ignore[attr-defined]


def _plus(n: Optional[int]) -> str:
    return "—" if n is None else "{:+,}".format(n)


# --- live inspection -----------------------------------------------------------------------

def gpu_bar(g: GpuLedger, width: int = 60) -> List[Tuple[str, int, str]]:
    """Segments across the GPU's total memory, from NVML now; free is left blank."""
    if not g.total_bytes:
        return []
    segments = [(ITEM_LABELS[item.kind], item.bytes, colour) for item in g.items
                for colour in (ITEM_COLOURS[item.kind],) if colour and item.bytes and item.bytes > 0]
    return _cells(segments, g.total_bytes, width)


def render_inspections(inspections: Sequence[Inspection], color: bool = True, width: int = 110) -> str:
    return _render_each(inspections, _render_inspection, color, width)


def _render_inspection(c: "object", insp: Inspection) -> None:
    from rich.table import Table
    from rich.text import Text

    snap = insp.snapshot
    nv = snap.nvml
    head = Text()
    head.append("kvforensics ", style="bold")
    head.append(insp.target, style="bold cyan")
    head.append("  ({}, taken {})".format(insp.status, _when(snap.taken_at_unix_s)))
    c.print(head)  # type: ignore[attr-defined]
    facts = []
    if nv.driver_version:
        facts.append("driver {}".format(nv.driver_version))
    facts.append("{} GPU(s)".format(len(insp.gpus)))
    hm = insp.host_memory
    if hm.available_bytes is not None:
        facts.append("host RAM {} GiB available of {} GiB".format(_gib(hm.available_bytes), _gib(hm.total_bytes)))
    c.print("  " + " · ".join(facts))  # type: ignore[attr-defined]
    for p in insp.problems:
        c.print(Text("  ! {}: {}".format(p.code, p.message), style="yellow"))  # type: ignore[attr-defined]
    if insp.gpus:
        table = Table(title="GPUs now (NVML; GiB)", title_justify="left", show_edge=False, pad_edge=False)
        for col, just in (("GPU", "right"), ("name", "left"), ("rank", "left"), ("total", "right"), ("used", "right"),
                          ("free", "right"), ("engine", "right"), ("other procs", "right"), ("reserved", "right")):
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        for g in insp.gpus:
            engine = g.held_by(Owner.ENGINE)
            other = sum(p.used_bytes or 0 for p in g.processes if p.owner is not Owner.ENGINE)
            table.add_row(str(g.index), (g.name or "?") if g.status == "ok" else g.status.upper(), g.rank or "—",
                          _gib(g.total_bytes), _gib(g.used_bytes), _gib(g.free_bytes),
                          _gib(engine) if engine else "—", _gib(other) if other else "—", _gib(g.reserved_bytes))
        c.print(table)  # type: ignore[attr-defined]
        c.print(Text("Where each GPU's memory is now:", style="bold"))  # type: ignore[attr-defined]
        labels = []
        for g in insp.gpus:
            line = Text("  GPU {:>2} ".format(g.index))
            segs = gpu_bar(g)
            for label, cells, colour in segs:
                line.append("█" * cells, style=colour)
                if label not in labels:
                    labels.append(label)
            line.append("░" * (60 - sum(x[1] for x in segs)), style="dim")
            line.append(" {} GiB free".format(_gib(g.free_bytes)))
            c.print(line)  # type: ignore[attr-defined]
        legend = Text("  ")
        colours = {ITEM_LABELS[k]: c for k, c in ITEM_COLOURS.items()}
        for label in labels:
            legend.append("█ ", style=colours[label])
            legend.append(label + "  ")
        legend.append("░ free", style="dim")
        c.print(legend)  # type: ignore[attr-defined]
    if insp.analysis is not None:
        c.print(Text("From the engine's startup log ({}):".format(snap.engine_log.source),  # type: ignore[attr-defined]
                     style="bold"))
        _render_one(c, insp.analysis, live=True)
    _findings(c, insp.findings)
    a = insp.analysis
    _recommendations(c, insp.recommendations, a.summary.context_len if a else None, insp.options.request_tokens)


def _when(ts: Optional[float]) -> str:
    import datetime

    if not ts:
        return "?"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")



def fleet_rows(results: Sequence[Any]) -> List[Tuple[str, ...]]:
    """(host, status, GPUs, engine, model, KV tokens, unused GiB, worst finding) per target, in order."""
    rows = []
    for i in results:
        if isinstance(i, TargetFailure):  # a target that could not be collected
            rows.append((i.target.split(":", 1)[-1], i.status, "—", "—", "—", "—", "—", i.message))
            continue
        a = i.analysis
        model = ""
        if a is not None and a.server_args.get("model_path"):
            model = str(a.server_args["model_path"]).rstrip("/").rsplit("/", 1)[-1]
        elif i.engine_args and i.engine_args.get("model_path"):
            model = str(i.engine_args["model_path"]).rstrip("/").rsplit("/", 1)[-1]
        unused = next((f.bytes for f in i.findings if f.code == "unused_gpu_memory"), None)
        worst = max(i.findings, key=lambda f: severity_rank(f.severity), default=None)
        rows.append((i.target.split(":", 1)[-1], i.status, str(len(i.gpus)),
                     "SGLang " + a.era.hint if a else ("SGLang (no log)" if i.engine else "—"), model or "—",
                     "{:,}".format(a.summary.max_total_num_tokens) if a and a.summary.max_total_num_tokens else "—",
                     _gib(unused) if unused else "—",
                     "{} {}".format(worst.severity, worst.code) if worst else "—"))
    return rows


def render_fleet(results: Sequence[Any], color: bool = True, width: int = 110) -> str:
    """The fleet summary table; ``results`` holds Inspections and failed targets, in order."""
    from rich.table import Table

    buf, c = console(color, width)
    collected = sum(1 for r in results if not isinstance(r, TargetFailure))
    table = Table(title="kvforensics: {} host(s), {} collected".format(len(results), collected),
                  title_justify="left", show_edge=False, pad_edge=False)
    for col, just in (("host", "left"), ("status", "left"), ("GPUs", "right"), ("engine", "left"), ("model", "left"),
                      ("KV tokens", "right"), ("unused GiB", "right"), ("worst finding", "left")):
        table.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    for row in fleet_rows(results):
        style = None if row[1] in ("ok", "partial") else "red"
        table.add_row(*row, style=style)
    c.print(table)  # type: ignore[attr-defined]
    return text_of(buf)
