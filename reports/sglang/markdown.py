"""An SGLang startup in Markdown: the same evidence as on screen, as pipe tables and a code block."""

from __future__ import annotations

from typing import List

from kvforensics.agent.sglang.analysis import Analysis
from kvforensics.agent.sglang.rules import reserve_breakdown
from kvforensics.reports import terminal
from kvforensics.reports.markdown import escape, plain, table
from kvforensics.reports.sglang import terminal as sglang_terminal


def markdown(a: Analysis) -> List[str]:
    """Header, the per-rank ledger, the bars in a code block, and where the reserve went."""
    lines: List[str] = []
    buf, c = terminal.console(False, 10**4)
    sglang_terminal.header(c, a)
    lines += [escape(x.strip()) + "  " for x in terminal.text_of(buf).splitlines()] + [""]
    groups = sglang_terminal.collapse(a.ranks)
    if groups:
        rows = sglang_terminal.ledger_rows(a, groups)
        lines += ["#### Memory ledger per rank (GiB; 1 GiB = 2^30 B; SGLang's \"GB\" is GiB)", ""]
        header = ["item"] + [label for label, _ in groups] + ["source ({})".format(groups[0][0])]
        lines += table(header, rows, [False] + [True] * len(groups) + [False])
    if any(r.target.pre_load_avail_bytes for _, r in groups):
        lines += ["#### Where each GPU's pre-load free memory went", ""]
        lines += plain(lambda c: sglang_terminal.rank_bars(c, groups, a.complete))
    reserve = reserve_breakdown(a) if a.complete else []
    if reserve and a.budget.reserve_bytes:
        lines += ["#### Where the {} GiB reserve went (rank with the least free memory)".format(
            terminal.gib_cell(a.budget.reserve_bytes)), ""]
        lines += table(["GiB", "item", "source"], [[terminal.gib_cell(n), name, src] for name, n, src in reserve],
                        [True, False, False])
    return lines
