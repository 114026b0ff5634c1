"""The report as Markdown, for tickets and chat (``--format markdown``).

The same report as the terminal's, verdict first: headings, pipe tables (identical GPUs and
ranks collapsed as on screen), the bars as plain glyphs in a code block, findings and numbered
recommendations as lists. Markdown reflows prose, so nothing here is wrapped to a width; the
bars and their legends are drawn by the terminal renderer without colour.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

from kvforensics.agent.model.live import Inspection, TargetFailure
from kvforensics.agent.model.records import Finding, Recommendation, Verdict
from kvforensics.agent.model.severity import severity_rank
from kvforensics.agent.plugin import EngineAnalysis
from kvforensics.reports import fit, terminal
from kvforensics.reports.plugin import VIEWS

BAR_WIDTH = 100  # columns the code-block bars are drawn for (wide enough for 60 cells and labels)


def escape(text: str) -> str:
    """Text as Markdown shows it literally (pipes would end a table cell; * and < start markup)."""
    out = text.replace("\\", "\\\\")
    for ch in "|*<>[]":
        out = out.replace(ch, "\\" + ch)
    return out


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> List[str]:
    lines = ["| " + " | ".join(escape(h) for h in header) + " |",
             "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(escape(x) for x in row) + " |" for row in rows]
    return lines + [""]


def plain(draw: Callable[[Any], None]) -> List[str]:
    """What a terminal section draws without colour, but its title line, as a code block (bars and
    their legends: the glyphs say what each cell is without colour)."""
    buf, c = terminal.console(False, BAR_WIDTH)
    draw(c)
    return ["```text"] + terminal.text_of(buf).rstrip("\n").splitlines()[1:] + ["```", ""]


def _verdict(v: Optional[Verdict], memory: str = "") -> List[str]:
    if v is None:
        return []
    lines = ["**{}**".format(escape(v.question)), ""]
    for label, text in (("Cause", v.cause), ("Proof", v.proof), ("Memory", memory), ("Action", v.action)):
        if text:
            lines.append("- **{}:** {}".format(label, escape(text)))
    return lines + [""]


# --- the short report: each finding and recommendation in a line -------------------------------

HINT = "*Full report (ledger, sources, bars, each finding in full): add `--detail`.*"


def _brief(findings: Sequence[Finding], recs: Sequence[Recommendation], request_tokens: int) -> List[str]:
    """Findings (most severe first) and recommendations (best first), a line each, then the hint."""
    lines: List[str] = []
    shown = [f for f in findings if f.code != "reserve_breakdown"]
    if shown:
        lines += ["### Findings", ""]
        lines += ["- **{}** {}".format(f.severity.upper(), escape(f.title))
                  for f in sorted(shown, key=lambda f: -severity_rank(f.severity))]
        lines.append("")
    if recs:
        lines += ["### {}".format(terminal.recommendations_heading(request_tokens)), ""]
        for i, r in enumerate(recs, 1):
            gains = terminal.recommendation_gains(r)
            lines.append("{}. `{} {}`{} ({})".format(i, r.flag, r.value, ": " + escape(gains) if gains else "",
                                                     r.basis))
        lines.append("")
    return lines + [HINT, ""]


def _engine_brief(a: EngineAnalysis) -> List[str]:
    """The startup in a sentence or two, then its problems."""
    lines = [escape(sentence) + "  " for sentence in VIEWS.get(a.engine).brief(a)]
    lines += ["- ! {}".format(escape(text)) for text in terminal.grouped_problems(a.problems)]
    return lines + [""] if lines else []


def _findings(findings: Sequence[Finding]) -> List[str]:
    shown = [f for f in findings if f.code != "reserve_breakdown"]  # shown as its own table
    if not shown:
        return []
    lines = ["### Findings", ""]
    for f in shown:
        lines.append("- **{}** `{}`: {}  ".format(f.severity.upper(), f.code, escape(f.title)))
        lines.append("  {}".format(escape(f.detail)) + ("  " if f.evidence else ""))
        if f.evidence:
            lines.append("  *evidence:* {}".format(escape("; ".join(f.evidence))))
    return lines + [""]


def _recommendations(recs: Sequence[Recommendation], context_len: Optional[int], request_tokens: int) -> List[str]:
    if not recs:
        return []
    lines = ["### Recommendations", "",
             "Best first; gains per rank; requests = more concurrent requests at context_len {} / at {:,} "
             "tokens.".format(terminal.count(context_len), request_tokens), ""]
    for i, r in enumerate(recs, 1):
        gains = terminal.gain_text(r)
        lines.append("{}. `{} {}` ({}){}  ".format(i, r.flag, r.value, r.basis, " — " + gains if gains else ""))
        lines.append("   {}".format(escape(r.rationale)))
    return lines + [""]


# --- a startup log ------------------------------------------------------------------------------

def render(analyses: Sequence[EngineAnalysis], detail: bool = True) -> str:
    """The full report (``detail``), or the short one: verdict, the startup in brief, each finding and
    recommendation in a line."""
    parts = []
    for a in analyses:
        if not detail:
            parts += _brief_analysis(a)
            continue
        parts += ["## kvforensics `{}`".format(a.target), ""] + _verdict(a.verdict) + ["### Evidence", ""]
        parts += _startup(a)
        parts += _findings(a.findings)
        parts += _recommendations(a.recommendations, a.summary.context_len, a.options.request_tokens)
    return "\n".join(parts).rstrip("\n") + "\n"


def _brief_analysis(a: EngineAnalysis) -> List[str]:
    lines = ["## kvforensics `{}`".format(a.target), ""]
    lines += _verdict(a.verdict, terminal.memory_line(a.verdict, a.findings))
    return lines + _engine_brief(a) + _brief(a.findings, a.recommendations, a.options.request_tokens)


def _startup(a: EngineAnalysis) -> List[str]:
    """The startup's evidence in its engine's Markdown; an engine without one is drawn as on screen,
    without colour (a header line first: _plain drops a section's first line)."""
    view = VIEWS.get(a.engine)
    if view.markdown is not None:
        return view.markdown(a)
    return plain(lambda c: (c.print(""), view.terminal(c, a)))


# --- live inspection --------------------------------------------------------------------------

def render_inspections(inspections: Sequence[Inspection], detail: bool = True) -> str:
    """Each node's full report (``detail``), or its short one: verdict, the GPUs, the startup in brief,
    each finding and recommendation in a line."""
    parts: List[str] = []
    for insp in inspections:
        parts += _inspection(insp) if detail else _brief_inspection(insp)
    return "\n".join(parts).rstrip("\n") + "\n"


def _brief_inspection(insp: Inspection) -> List[str]:
    lines = ["## kvforensics `{}` ({})".format(insp.target, insp.status), ""]
    lines += _verdict(insp.verdict, terminal.memory_line(insp.verdict, insp.findings))
    lines += [escape(terminal.node_facts(insp)), ""]
    lines += ["- ! {}".format(escape(text)) for text in terminal.grouped_problems(insp.problems)]
    lines += [""] if insp.problems else []
    lines += _gpu_table(insp) if insp.gpus else []
    lines += _engine_brief(insp.analysis) if insp.analysis is not None else []
    return lines + _brief(insp.findings, insp.recommendations, insp.options.request_tokens)


def _gpu_table(insp: Inspection) -> List[str]:
    rows = []
    for group in terminal.gpu_groups(insp.gpus):
        cells = terminal.gpu_cells(group[0])
        rows.append([terminal.gpu_label(group), cells[0], fit.rank_label([g.rank for g in group])] + list(cells[1:]))
    return ["#### GPUs now (NVML; GiB; identical GPUs share a row)", ""] + table(
        ["GPU", "name", "rank", "total", "used", "free", "engine", "others", "reserved"], rows,
        [True, False, False, True, True, True, True, True, True])


def _inspection(insp: Inspection) -> List[str]:
    lines = ["## kvforensics `{}` ({})".format(insp.target, insp.status), ""] + _verdict(insp.verdict)
    lines += ["### Evidence", ""]
    lines += [escape(terminal.node_facts(insp)), ""]
    lines += ["- ! {}: {}".format(p.code, escape(p.message)) for p in insp.problems]
    lines += [""] if insp.problems else []
    if insp.gpus:
        groups = terminal.gpu_groups(insp.gpus)
        lines += _gpu_table(insp)
        lines += ["#### Where each GPU's memory is now", ""]
        lines += plain(lambda c: terminal.gpu_bars(c, groups))
    if insp.analysis is not None:
        lines += ["### From the engine's startup log (`{}`)".format(insp.snapshot.engine_log.source), ""]
        lines += _startup(insp.analysis)
    lines += _findings(insp.findings)
    a = insp.analysis
    lines += _recommendations(insp.recommendations, a.summary.context_len if a else None,
                              insp.options.request_tokens)
    return lines


# --- fleets -----------------------------------------------------------------------------------

def render_fleet(results: Sequence[Any]) -> str:
    collected = sum(1 for r in results if not isinstance(r, TargetFailure))
    lines = ["## kvforensics: {} host(s), {} collected".format(len(results), collected), ""]
    header = [col.header for col in terminal.FLEET_COLUMNS]
    lines += table(header, terminal.fleet_rows(results), [col.justify == "right" for col in terminal.FLEET_COLUMNS])
    lines.append("unused: GiB per GPU beyond the margin.")
    return "\n".join(lines) + "\n"
