"""The report as Markdown, for tickets and chat (``--format markdown``).

The same report as the terminal's, verdict first: headings, pipe tables (identical GPUs and
ranks collapsed as on screen), the bars as plain glyphs in a code block, findings and numbered
recommendations as lists. Markdown reflows prose, so nothing here is wrapped to a width; the
bars and their legends are drawn by the terminal renderer without colour.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

from agent.model.live import Inspection, TargetFailure
from agent.model.records import Finding, Recommendation, Verdict
from agent.plugin import EngineAnalysis
from reports import fit, terminal
from reports.plugin import VIEWS

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


def _verdict(v: Optional[Verdict]) -> List[str]:
    if v is None:
        return []
    lines = ["**{}**".format(escape(v.question)), ""]
    for label, text in (("Cause", v.cause), ("Proof", v.proof), ("Action", v.action)):
        if text:
            lines.append("- **{}:** {}".format(label, escape(text)))
    return lines + [""]


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

def render(analyses: Sequence[EngineAnalysis]) -> str:
    parts = []
    for a in analyses:
        parts += ["## kvforensics `{}`".format(a.target), ""] + _verdict(a.verdict) + ["### Evidence", ""]
        parts += _startup(a)
        parts += _findings(a.findings)
        parts += _recommendations(a.recommendations, a.summary.context_len, a.options.request_tokens)
    return "\n".join(parts).rstrip("\n") + "\n"


def _startup(a: EngineAnalysis) -> List[str]:
    """The startup's evidence in its engine's Markdown; an engine without one is drawn as on screen,
    without colour (a header line first: _plain drops a section's first line)."""
    view = VIEWS.get(a.engine)
    if view.markdown is not None:
        return view.markdown(a)
    return plain(lambda c: (c.print(""), view.terminal(c, a)))


# --- live inspection --------------------------------------------------------------------------

def render_inspections(inspections: Sequence[Inspection]) -> str:
    parts: List[str] = []
    for insp in inspections:
        parts += _inspection(insp)
    return "\n".join(parts).rstrip("\n") + "\n"


def _inspection(insp: Inspection) -> List[str]:
    snap = insp.snapshot
    lines = ["## kvforensics `{}` ({})".format(insp.target, insp.status), ""] + _verdict(insp.verdict)
    lines += ["### Evidence", ""]
    facts = ["taken {}".format(terminal.when(snap.taken_at_unix_s))]
    if snap.nvml.driver_version:
        facts.append("driver {}".format(snap.nvml.driver_version))
    facts.append("{} GPU(s)".format(len(insp.gpus)))
    hm = insp.host_memory
    if hm.available_bytes is not None:
        facts.append("host RAM {} GiB available of {} GiB".format(terminal.gib_cell(hm.available_bytes),
                                                                  terminal.gib_cell(hm.total_bytes)))
    lines += [escape(" · ".join(facts)), ""]
    lines += ["- ! {}: {}".format(p.code, escape(p.message)) for p in insp.problems]
    lines += [""] if insp.problems else []
    if insp.gpus:
        groups = terminal.gpu_groups(insp.gpus)
        rows = []
        for group in groups:
            cells = terminal.gpu_cells(group[0])
            rows.append([terminal.gpu_label(group), cells[0], fit.rank_label([g.rank for g in group])]
                        + list(cells[1:]))
        lines += ["#### GPUs now (NVML; GiB; identical GPUs share a row)", ""]
        lines += table(["GPU", "name", "rank", "total", "used", "free", "engine", "others", "reserved"], rows,
                        [True, False, False, True, True, True, True, True, True])
        lines += ["#### Where each GPU's memory is now", ""]
        lines += plain(lambda c: terminal.gpu_bars(c, groups))
    if insp.analysis is not None:
        lines += ["### From the engine's startup log (`{}`)".format(snap.engine_log.source), ""]
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
