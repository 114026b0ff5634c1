"""The terminal report (rich), in two lengths. By default the answer on one screen: the verdict
(with the unused memory), the node's facts and problems, the GPUs (identical ones in a row), the
startup in brief (its engine's view says it), each finding and recommendation in a line, and how
to see the rest. With ``detail`` the full report: the verdict, then the evidence — header,
per-rank ledger, a bar per group of identical GPUs or ranks, the reserve, findings,
recommendations.

GiB appear only here, labelled; the records underneath are bytes. Ranks whose ledgers are
identical are one column ("TP1–TP7"); identical GPUs one row ("0–7 ×8"). Every width from 80
columns up fits without breaking a word: tables give way by column priority and move long
names, sources and formulas to numbered footnotes (``reports/fit.py``). Without colour each
ledger item's bar cells are its own letter, with a legend, so a pasted bar still reads.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from kvforensics.agent.model.live import GpuLedger, Inspection, Owner, TargetFailure
from kvforensics.agent.model.records import Finding, Recommendation, Verdict
from kvforensics.agent.model.severity import severity_rank
from kvforensics.agent.model.verdict import CAUSE_LINES
from kvforensics.agent.plugin import EngineAnalysis, display
from kvforensics.collectors.units import GIB
from kvforensics.reports import fit
from kvforensics.reports.fit import NOTES, Col
from kvforensics.reports.labels import FREE_GLYPH, ITEM_COLOURS, ITEM_GLYPHS, ITEM_LABELS
from kvforensics.reports.plugin import VIEWS

SEVERITY_STYLE = {"critical": "bold white on red", "error": "bold red", "warning": "yellow", "info": "cyan"}
BAR_CELLS = 60  # the widest a bar gets; narrower terminals get narrower bars
FULL_BLOCK = "█"  # every item's cell, with colour
FREE_CELL = "░"  # free memory (live) or memory the ledger does not account for (log), with colour
INDENT = 9  # findings' text under "CRITICAL "

def console(color: bool, width: int) -> Tuple[io.StringIO, "object"]:
    """A rich console writing into a buffer (renderers return text; the CLI prints it)."""
    from rich.console import Console

    buf = io.StringIO()
    return buf, Console(file=buf, width=width, force_terminal=color, no_color=not color,
                        color_system="truecolor" if color else None, highlight=False, emoji=False)


def text_of(buf: io.StringIO) -> str:
    # rich pads every line to the console width; trailing blanks only hurt copy-paste
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def gib_cell(n: Optional[int]) -> str:
    return "—" if n is None else "{:.2f}".format(n / GIB)


def count(n: Optional[int]) -> str:
    return "—" if n is None else "{:,}".format(n)


def _plus(n: Optional[int]) -> str:
    return "—" if n is None else "{:+,}".format(n)


def _width(c: Any) -> int:
    return int(c.width)


def _colored(c: Any) -> bool:
    return not c.no_color


# --- text that wraps at words ----------------------------------------------------------------

def say(c: Any, text: str, indent: int = 0, style: Optional[str] = None, first: str = "",
         first_style: Optional[str] = None) -> None:
    """``text`` wrapped at words under ``indent`` columns; ``first`` (e.g. a severity) fills the
    indent of the first line."""
    _print_lines(c, fit.wrap(text, max(20, _width(c) - indent)), indent, style, first, first_style)


def _print_lines(c: Any, lines: Sequence[str], indent: int, style: Optional[str], first: str,
                 first_style: Optional[str]) -> None:
    """Lines already fitted to the width, under ``indent`` columns, ``first`` in the first line's indent."""
    from rich.text import Text

    for i, line in enumerate(lines or [""]):
        t = Text()
        lead = first if i == 0 else ""
        t.append(lead, style=first_style)
        t.append(" " * (indent - fit.cell_len(lead)))
        t.append(line, style=style)
        c.print(t, no_wrap=True, overflow="ignore", crop=False)


def _heading(c: Any, text: str) -> None:
    say(c, text, style="bold")


# --- tables that fit ---------------------------------------------------------------------------

def print_table(c: Any, title: Optional[str], columns: Sequence[Col], rows: Sequence[Sequence[str]],
           row_styles: Optional[Sequence[Optional[str]]] = None) -> None:
    """A table fitted to the console (``reports/fit.py``), its title above and footnotes below; a table
    whose required columns are wider than the console is printed as several, its first column in each."""
    from rich.table import Table
    from rich.text import Text

    if title:
        _heading(c, title)
    for fitted in fit.fit_tables(columns, rows, _width(c)):  # several only when the required columns are too wide
        table = Table(show_edge=False, pad_edge=False, expand=False)
        for col, w in zip(fitted.columns, fitted.widths):
            table.add_column(col.header, justify=col.justify, width=w, no_wrap=True, overflow="ellipsis",  # type: ignore[arg-type]
                             style=col.style)
        for i, row in enumerate(fitted.rows):
            # Text, not markup: a cell is data from a host or a file ("[/bold]" in a rank stays text), and a cell
            # moved to a footnote is the same characters there
            table.add_row(*(Text(cell) for cell in row), style=row_styles[i] if row_styles else None)
        c.print(table)
        for marker, text in fitted.notes:
            say(c, text, indent=len(marker) + 1, first=marker, style="dim")


# --- bars ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Segment:
    """One item's run of cells in a memory bar: its label, how many cells, its colour and glyph."""

    label: str
    cells: int
    colour: str
    glyph: str


def _cells(segments: Sequence[Tuple[str, int, str, str]], total: int, width: int) -> List[Segment]:
    """(label, bytes, colour, glyph) -> segments across ``width`` cells for ``total`` bytes, by
    largest remainder, so items that sum to the total fill the bar exactly."""
    values = [max(0, value) for _, value, _, _ in segments]
    if sum(values) > 2 * max(total, 1):  # a forged total far below its items: share the bar by their sum
        total = sum(values)
    exact = [value / max(total, 1) * width for value in values]
    target = min(width, int(round(sum(exact))))
    cells = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - cells[i], reverse=True)
    for i in by_remainder[:max(0, target - sum(cells))]:
        cells[i] += 1
    while sum(cells) > width:  # items that overstate the total (a log's rounding): trim the largest
        cells[cells.index(max(cells))] -= 1  # at most ``width`` passes: the items are below twice the total
    return [Segment(label, n, colour, glyph) for (label, _, colour, glyph), n in zip(segments, cells) if n > 0]


def gpu_bar(g: GpuLedger, width: int = BAR_CELLS) -> List[Segment]:
    """Segments across the GPU's total memory, from NVML now; free is left blank."""
    if not g.total_bytes:
        return []
    segments = [(ITEM_LABELS[item.kind], item.bytes, colour, ITEM_GLYPHS[item.kind]) for item in g.items
                for colour in (ITEM_COLOURS[item.kind],) if colour and item.bytes and item.bytes > 0]
    return _cells(segments, g.total_bytes, width)


def _bar_width(c: Any, label_width: int, suffix_width: int) -> int:
    return max(10, min(BAR_CELLS, _width(c) - 2 - label_width - 1 - suffix_width))


def _bar_text(label: str, label_width: int, segments: Sequence[Segment], cells: int, suffix: str,
              colored: bool, blank: str) -> Any:
    from rich.text import Text

    line = Text("  " + label.rjust(label_width) + " ")
    for s in segments:
        line.append((FULL_BLOCK if colored else s.glyph) * s.cells, style=s.colour if colored else None)
    line.append((FREE_CELL if colored else blank) * (cells - sum(s.cells for s in segments)),
                style="dim" if colored else None)
    line.append(suffix)
    return line


def _legend(c: Any, entries: Sequence[Tuple[str, Optional[str], str]]) -> None:
    """'█ weights  █ KV pool …' with colour, 'W weights  K KV pool …' without; an entry is never split."""
    from rich.text import Text

    colored = _colored(c)
    width = _width(c)
    line, used = Text("  "), 2
    for glyph, colour, label in entries:
        mark = FULL_BLOCK if colored and colour else glyph
        size = fit.cell_len(mark) + 1 + fit.cell_len(label)
        if used > 2 and used + 2 + size > width:
            c.print(line, no_wrap=True, overflow="ignore", crop=False)
            line, used = Text("  "), 2
        if used > 2:
            line.append("  ")
            used += 2
        line.append(mark, style=(colour or "dim") if colored else None)
        line.append(" " + label)
        used += size
    c.print(line, no_wrap=True, overflow="ignore", crop=False)


# --- the verdict --------------------------------------------------------------------------------

VERDICT_LABEL = 10  # "  action  "


def _verdict(c: Any, v: Optional[Verdict], memory: str = "") -> None:
    """At most 11 lines at any width: the question (≤ 2), the cause (≤ 5: a mechanism is kept whole at 80
    columns, agent/model/verdict.py CAUSE_LINES), proof and action (≤ 2 each), and in the one-screen report
    the unused-memory figure (1; the proof gives a line up when the question takes two); longer texts end in
    '…' — the whole of each is in the findings and recommendations below."""
    from rich.text import Text

    if v is None:
        return
    width = _width(c)
    question = fit.clip(v.question, width, 2)
    for line in question:
        c.print(Text(line, style="bold"), no_wrap=True, overflow="ignore", crop=False)
    rows = [("cause", v.cause, None, CAUSE_LINES), ("proof", v.proof, None, 1 if memory and len(question) > 1 else 2),
            ("memory", memory, None, 1), ("action", v.action, "bold green", 2)]
    for label, text, style, most in rows:
        if not text:
            continue
        for i, line in enumerate(fit.clip(text, width - VERDICT_LABEL, most)):
            t = Text("  ")
            t.append((label if i == 0 else "").ljust(VERDICT_LABEL - 2), style="bold")
            t.append(line, style=style)
            c.print(t, no_wrap=True, overflow="ignore", crop=False)


MEMORY_FINDINGS = ("unused_gpu_memory", "low_headroom")  # the verdict's memory row, in this order


def memory_line(v: Optional[Verdict], findings: Sequence[Finding]) -> str:
    """The unused (or missing) memory in a line, for the one-screen verdict: the finding's title, unless
    that finding is already the cause."""
    for code in MEMORY_FINDINGS:
        f = next((f for f in findings if f.code == code), None)
        if f is not None and (v is None or code not in (v.cause_finding, v.symptom_finding)):
            return f.title
    return ""


def _evidence_rule(c: Any) -> None:
    c.rule("evidence", style="dim")


# --- findings and recommendations -------------------------------------------------------------

def _findings(c: Any, findings: Sequence[Finding]) -> None:
    shown = [f for f in findings if f.code != "reserve_breakdown"]  # shown as its own table
    if not shown:
        return
    from rich.text import Text

    c.print(Text("Findings", style="bold underline"))
    for f in shown:
        # the code (what --json and the docs call it) with its title, as a problem's "code: message", never alone
        say(c, "{}: {}".format(f.code, f.title), indent=INDENT, style="bold", first=f.severity.upper(),
            first_style=SEVERITY_STYLE[f.severity])
        say(c, f.detail, indent=INDENT)
        if f.evidence:
            say(c, "evidence: " + "; ".join(f.evidence), indent=INDENT, style="dim")


def _recommendations(c: Any, recs: Sequence[Recommendation], context_len: Optional[int],
                     request_tokens: int) -> None:
    if not recs:
        return
    from rich.text import Text

    c.print(Text("Recommendations", style="bold underline"))
    say(c, "Best first; gains per rank; requests = more concurrent requests at context_len {} / at {:,} "
            "tokens.".format(count(context_len), request_tokens), style="dim")
    for i, r in enumerate(recs, 1):
        say(c, "{} {}  [{}]".format(r.flag, r.value, r.basis), indent=3, style="bold green", first="{}.".format(i))
        gains = gain_text(r)
        if gains:
            say(c, gains, indent=3)
        say(c, r.rationale, indent=3)


# --- the one-screen report: each finding, recommendation and problem on a line ------------------

HINT = "Full report (ledger, sources, bars, each finding in full): add --detail"


def clipped(c: Any, text: str, indent: int, most: int, first: str = "", style: Optional[str] = None,
            first_style: Optional[str] = None) -> None:
    """``text`` in at most ``most`` lines under ``indent`` columns, ``first`` in the indent of the first;
    cut after a word, never after a figure (``fit.clip``)."""
    _print_lines(c, fit.clip(text, max(20, _width(c) - indent), most), indent, style, first, first_style)


def finding_lines(c: Any, findings: Sequence[Finding]) -> None:
    """Every finding in one line, most severe first: severity and title."""
    shown = [f for f in findings if f.code != "reserve_breakdown"]  # a table: --detail shows it
    if not shown:
        return
    from rich.text import Text

    c.print(Text("Findings", style="bold underline"))
    for f in sorted(shown, key=lambda f: -severity_rank(f.severity)):
        clipped(c, f.title, INDENT, 1, first=f.severity.upper(), first_style=SEVERITY_STYLE[f.severity])


def recommendation_lines(c: Any, recs: Sequence[Recommendation], request_tokens: int) -> None:
    """Each recommendation in a line (two at most), best first: the flag, what it gains, its basis."""
    if not recs:
        return
    from rich.text import Text

    c.print(Text(recommendations_heading(request_tokens), style="bold underline"))
    for i, r in enumerate(recs, 1):
        clipped(c, recommendation_line(r), 3, 2, first="{}.".format(i), style="green")


def recommendations_heading(request_tokens: int) -> str:
    return "Recommendations (best first; gains per rank; requests of {:,} tokens)".format(request_tokens)


def recommendation_line(r: Recommendation) -> str:
    """'--mem-fraction-static 0.912: +45,981 KV tokens, +6 requests (estimated)'."""
    gains = recommendation_gains(r)
    return "{} {}{} ({})".format(r.flag, r.value, ": " + gains if gains else "", r.basis)


def recommendation_gains(r: Recommendation) -> str:
    """The KV tokens it adds, else the memory; and the concurrent requests it adds ('' for a fix)."""
    parts = []
    if r.gain_tokens:
        parts.append("{:+,} KV tokens".format(r.gain_tokens))
    elif r.gain_bytes:
        parts.append("{:+.2f} GiB".format(r.gain_bytes / GIB))
    more = r.gain_requests.get("at_request_tokens") if r.gain_requests else None
    if more:
        parts.append("{:+,} requests".format(more))
    return ", ".join(parts)


_GPU_PREFIX = re.compile(r"^GPU (\d+): ")


def grouped_problems(problems: Sequence[Any], codes: bool = True) -> List[str]:
    """'code: message' (or the message alone) per problem, those that differ only in their GPU as one
    ('GPU 0,2–7: …')."""
    groups: Dict[Tuple[str, str, bool], List[int]] = {}
    for p in problems:
        m = _GPU_PREFIX.match(p.message)
        gpus = groups.setdefault((p.code, p.message[m.end():] if m else p.message, m is not None), [])
        if m:
            gpus.append(int(m.group(1)))
    return ["{}{}{}".format(code + ": " if codes else "", "GPU {}: ".format(fit.ranges(gpus)) if per_gpu else "",
                            message) for (code, message, per_gpu), gpus in groups.items()]


def problem_lines(c: Any, problems: Sequence[Any]) -> None:
    """What could not be collected or read, a line each (the same on several GPUs: one line), in words: the codes
    are in --detail and the JSON."""
    for text in grouped_problems(problems, codes=False):
        clipped(c, text, 2, 1, first="!", style="yellow", first_style="yellow")


def engine_brief(c: Any, a: EngineAnalysis) -> None:
    """The startup in a sentence or two (its engine's view says what), then its problems."""
    from rich.text import Text

    for sentence in VIEWS.get(a.engine).brief(a):
        for line in fit.pack_facts(sentence, _width(c)):
            c.print(Text(line), no_wrap=True, overflow="ignore", crop=False)
    problem_lines(c, a.problems)


def hint(c: Any) -> None:
    say(c, HINT, style="dim")


def gain_text(r: Recommendation) -> str:
    gains = []
    if r.gain_bytes is not None:
        gains.append("{:+.2f} GiB".format(r.gain_bytes / GIB))
    if r.gain_tokens is not None:
        gains.append("{:+,} KV tokens".format(r.gain_tokens))
    req = r.gain_requests
    if req:
        gains.append("{} / {} requests".format(_plus(req.get("at_context_len")), _plus(req.get("at_request_tokens"))))
    return ", ".join(gains)


# --- a startup log ------------------------------------------------------------------------------

def _render_each(items: Sequence[Any], one: Callable[[Any, Any], None], color: bool, width: int) -> str:
    """Render every item with ``one(console, item)``, a rule between them."""
    buf, c = console(color, width)
    for i, item in enumerate(items):
        if i:
            c.rule()  # type: ignore[attr-defined]
        one(c, item)
    return text_of(buf)


def render(analyses: Sequence[EngineAnalysis], color: bool = True, width: int = 110, detail: bool = True) -> str:
    """The full report (``detail``), or the answer on one screen: verdict, the startup in brief, each
    finding and recommendation in a line, and how to see the rest."""
    return _render_each(analyses, _render_analysis if detail else _brief_analysis, color, width)


def _brief_analysis(c: Any, a: EngineAnalysis) -> None:
    say(c, "kvforensics " + a.target, style="bold")
    _verdict(c, a.verdict, memory_line(a.verdict, a.findings))
    _evidence_rule(c)
    engine_brief(c, a)
    finding_lines(c, a.findings)
    recommendation_lines(c, a.recommendations, a.options.request_tokens)
    hint(c)


def _render_analysis(c: Any, a: EngineAnalysis) -> None:
    say(c, "kvforensics " + a.target, style="bold")
    _verdict(c, a.verdict)
    _evidence_rule(c)
    view = VIEWS.get(a.engine)
    view.terminal(c, a)
    _findings(c, a.findings)
    _recommendations(c, a.recommendations, a.summary.context_len, a.options.request_tokens)


# --- live inspection --------------------------------------------------------------------------

def render_inspections(inspections: Sequence[Inspection], color: bool = True, width: int = 110,
                       detail: bool = True) -> str:
    """Each node's full report (``detail``), or its answer on one screen: verdict, the GPUs (identical
    ones in a row), the startup in brief, each finding and recommendation in a line."""
    return _render_each(inspections, _render_inspection if detail else _brief_inspection, color, width)


def node_facts(insp: Inspection) -> str:
    """Which pod (when the engine runs in one), when, which driver, how many GPUs, how much host RAM."""
    snap = insp.snapshot
    pod = snap.engine_pod
    facts = ["pod {}/{} (container {})".format(pod.namespace, pod.name, pod.container or "?")] if pod else []
    facts.append("taken {}".format(when(snap.taken_at_unix_s)))
    if snap.nvml.driver_version:
        facts.append("driver {}".format(snap.nvml.driver_version))
    facts.append("{} GPU(s)".format(len(insp.gpus)))
    hm = insp.host_memory
    if hm.available_bytes is not None:
        facts.append("host RAM {} GiB available of {} GiB".format(gib_cell(hm.available_bytes),
                                                                  gib_cell(hm.total_bytes)))
    return " · ".join(facts)


def _brief_inspection(c: Any, insp: Inspection) -> None:
    say(c, "kvforensics {}  ({})".format(insp.target, insp.status), style="bold")
    _verdict(c, insp.verdict, memory_line(insp.verdict, insp.findings))
    _evidence_rule(c)
    for line in fit.pack_facts(node_facts(insp), _width(c)):
        say(c, line)
    problem_lines(c, insp.problems)
    if insp.gpus:
        _gpu_table(c, gpu_groups(insp.gpus))
    if insp.analysis is not None:
        engine_brief(c, insp.analysis)
    finding_lines(c, insp.findings)
    recommendation_lines(c, insp.recommendations, insp.options.request_tokens)
    hint(c)


def _render_inspection(c: Any, insp: Inspection) -> None:
    from rich.text import Text

    snap = insp.snapshot
    say(c, "kvforensics {}  ({})".format(insp.target, insp.status), style="bold")
    _verdict(c, insp.verdict)
    _evidence_rule(c)
    say(c, node_facts(insp))
    for p in insp.problems:
        say(c, "{}: {}".format(p.code, p.message), indent=4, first="  !", style="yellow", first_style="yellow")
    if insp.gpus:
        groups = gpu_groups(insp.gpus)
        _gpu_table(c, groups)
        gpu_bars(c, groups)
    if insp.analysis is not None:
        c.print(Text("From the engine's startup log ({}):".format(snap.engine_log.source), style="bold"))
        startup(c, insp.analysis)
    _findings(c, insp.findings)
    a = insp.analysis
    _recommendations(c, insp.recommendations, a.summary.context_len if a else None, insp.options.request_tokens)


def startup(c: Any, a: EngineAnalysis) -> None:
    """The startup's evidence, as its engine's view renders it (reports/<engine>/plugin.py)."""
    VIEWS.get(a.engine).terminal(c, a)


def engine_cell(i: Inspection) -> str:
    """The fleet table's engine column: name and what the log says of the release."""
    a = i.analysis
    name = display(i.engine_kind or (a.engine if a is not None else None), "?")
    if a is not None:
        return "{} {}".format(name, a.era.hint or "").strip()
    return "{} (no log)".format(name) if i.engine else "—"


def model_of(i: Inspection) -> str:
    for args in (i.analysis.server_args if i.analysis is not None else {}, i.engine_args or {}):
        model = args.get("model_path") or args.get("model")
        if model:
            return str(model).rstrip("/").rsplit("/", 1)[-1]
    return ""


def _others(g: GpuLedger) -> Optional[int]:
    """Memory held by processes that are not the engine's (None when none is known)."""
    known = [p.used_bytes for p in g.processes if p.owner is not Owner.ENGINE and p.used_bytes is not None]
    return sum(known) if known else None


def gpu_cells(g: GpuLedger) -> Tuple[str, ...]:
    """What a GPU's row shows, but its index and rank: GPUs showing the same are one row."""
    engine = g.held_by(Owner.ENGINE)
    name = "LOST" if g.status == "lost" else (g.name or "—").replace("NVIDIA ", "", 1)
    return (name, gib_cell(g.total_bytes), gib_cell(g.used_bytes), gib_cell(g.free_bytes),
            gib_cell(engine) if engine else "—", gib_cell(_others(g)), gib_cell(g.reserved_bytes))


def gpu_groups(gpus: Sequence[GpuLedger]) -> List[List[GpuLedger]]:
    """GPUs whose rows and bars are identical, as groups in index order ("0–7 ×8")."""
    keys = [(gpu_cells(g), tuple(gpu_bar(g))) for g in gpus]
    positions = fit.collapse_rows(keys, list(range(len(gpus))))
    return [[gpus[i] for i in members] for members in positions]


def gpu_label(group: Sequence[GpuLedger]) -> str:
    return fit.group_label([g.index for g in group])


def _gpu_table(c: Any, groups: List[List[GpuLedger]]) -> None:
    # At 80 columns the driver-reserved figure gives way first, then the GPU's name keeps its first words.
    columns = [Col("GPU", "right"), Col("name", priority=20, give=NOTES), Col("rank", priority=30, give=NOTES),
               Col("total", "right"), Col("used", "right"), Col("free", "right"), Col("engine", "right"),
               Col("others", "right"), Col("reserved", "right", priority=10)]
    rows = []
    for group in groups:
        cells = gpu_cells(group[0])
        rows.append([gpu_label(group), cells[0], fit.rank_label([g.rank for g in group])] + list(cells[1:]))
    print_table(c, "GPUs now (NVML; GiB; identical GPUs share a row)", columns, rows)


def gpu_bars(c: Any, groups: List[List[GpuLedger]]) -> None:
    from rich.text import Text

    c.print(Text("Where each GPU's memory is now:", style="bold"))
    labels = ["GPU " + gpu_label(group) for group in groups]
    label_width = max(fit.cell_len(x) for x in labels)
    suffixes = [" {} GiB free".format(gib_cell(group[0].free_bytes)) for group in groups]
    cells = _bar_width(c, label_width, max(fit.cell_len(s) for s in suffixes))
    seen: List[str] = []
    for label, group, suffix in zip(labels, groups, suffixes):
        segs = gpu_bar(group[0], cells)
        seen += [s.label for s in segs if s.label not in seen]
        c.print(_bar_text(label, label_width, segs, cells, suffix, _colored(c), FREE_GLYPH), no_wrap=True,
                overflow="ignore", crop=False)
    by_label = {ITEM_LABELS[k]: k for k in ITEM_LABELS}
    entries = [(ITEM_GLYPHS[by_label[label]], ITEM_COLOURS[by_label[label]], label) for label in seen]
    entries.append((FREE_CELL if _colored(c) else FREE_GLYPH, None, "free"))
    _legend(c, entries)


def when(ts: Optional[float]) -> str:
    import datetime

    if not ts:
        return "—"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# --- fleets -----------------------------------------------------------------------------------

# At 80 columns the engine and the model give way first, then the worst finding keeps its first
# words, and the host name last.
FLEET_COLUMNS = (Col("host", priority=40, give=NOTES), Col("status"), Col("GPUs", "right"),
                 Col("engine", priority=10), Col("model", priority=20), Col("KV tokens", "right"),
                 Col("unused", "right"), Col("worst finding", priority=30, give=NOTES))


def fleet_rows(results: Sequence[Any]) -> List[Tuple[str, ...]]:
    """(host, status, GPUs, engine, model, KV tokens, unused GiB, worst finding) per target, in order."""
    rows = []
    for i in results:
        if isinstance(i, TargetFailure):  # its reason is said once, on stderr (agent/cli/inspect.py)
            rows.append((i.target.split(":", 1)[-1], i.status, "—", "—", "—", "—", "—", "— (stderr)"))
            continue
        a = i.analysis
        model = model_of(i)
        unused = next((f.bytes for f in i.findings if f.code == "unused_gpu_memory"), None)
        worst = max(i.findings, key=lambda f: severity_rank(f.severity), default=None)
        rows.append((i.target.split(":", 1)[-1], i.status, str(len(i.gpus)),
                     engine_cell(i), model or "—",
                     "{:,}".format(a.summary.max_total_num_tokens) if a and a.summary.max_total_num_tokens else "—",
                     gib_cell(unused) if unused else "—",
                     "{} {}".format(worst.severity, worst.title) if worst else "—"))
    return rows


SORT_KEYS = ("unused", "host", "status")


def sort_results(results: Sequence[Any], key: Optional[str]) -> List[Any]:
    """--sort: most unused memory first, by host name, or worst status first (failures, partial, ok);
    stable, so ties keep the order given."""
    if key is None:
        return list(results)
    if key == "host":
        return sorted(results, key=lambda r: r.target.split(":", 1)[-1])
    if key == "status":
        order = {"ok": 2, "partial": 1}
        return sorted(results, key=lambda r: order.get(r.status, 0))
    return sorted(results, key=lambda r: -(_unused(r) or 0))


def _unused(r: Any) -> Optional[int]:
    if isinstance(r, TargetFailure):
        return None
    return next((f.bytes for f in r.findings if f.code == "unused_gpu_memory"), None)


# ``--format oneline``: for sort, awk and scripts. Plain numbers (tokens as digits, GiB as the header says), words
# (the worst finding's title, its severity in a column of its own), the same nine columns for every row; a target
# that could not be collected has its one-line reason last.
ONELINE_HEADER = ("host", "status", "GPUs", "engine", "model", "KV tokens", "unused GiB", "severity",
                  "worst finding")


def oneline_row(host: str, status: str, gpus: Optional[int], engine: str, model: Optional[str],
                tokens: Optional[int], unused: Optional[int], worst: Optional[Finding]) -> Tuple[str, ...]:
    return (host, status, str(gpus) if gpus else "—", engine or "—", model or "—", str(tokens) if tokens else "—",
            "{:.2f}".format(unused / GIB) if unused else "—", worst.severity if worst else "—",
            worst.title if worst else "—")


def render_oneline(results: Sequence[Any]) -> str:
    """One tab-separated line per target under ONELINE_HEADER."""
    rows = []
    for i in results:
        host = i.target.split(":", 1)[-1]
        if isinstance(i, TargetFailure):
            rows.append((host, i.status) + ("—",) * 6 + (i.message,))
            continue
        a = i.analysis
        worst = max(i.findings, key=lambda f: severity_rank(f.severity), default=None)
        rows.append(oneline_row(host, i.status, len(i.gpus), engine_cell(i), model_of(i),
                                a.summary.max_total_num_tokens if a else None, _unused(i), worst))
    return "\n".join(["\t".join(ONELINE_HEADER)] + ["\t".join(" ".join(c.split()) or "—" for c in row)
                                                    for row in rows]) + "\n"


def render_fleet(results: Sequence[Any], color: bool = True, width: int = 110) -> str:
    """The fleet summary table; ``results`` holds Inspections and failed targets, in order."""
    buf, c = console(color, width)
    collected = sum(1 for r in results if not isinstance(r, TargetFailure))
    rows = fleet_rows(results)
    styles = [None if row[1] in ("ok", "partial") else "red" for row in rows]
    print_table(c, "kvforensics: {} host(s), {} collected (unused: GiB per GPU beyond the margin)".format(
        len(results), collected), FLEET_COLUMNS, rows, styles)
    return text_of(buf)
