"""An SGLang startup in the terminal: header, the per-rank ledger (identical ranks as one column),
a bar per group of ranks across the memory free before loading, and where the reserve went."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from kvforensics.agent.sglang.analysis import Analysis
from kvforensics.agent.sglang.ledger import RankLedger, RunnerLedger
from kvforensics.agent.sglang.rules import reserve_breakdown
from kvforensics.reports import fit
from kvforensics.reports.fit import NOTES, Col
from kvforensics.reports.labels import LEDGER_GLYPHS
from kvforensics.reports.terminal import (
    BAR_CELLS,
    FREE_CELL,
    Segment,
    _bar_text,
    _bar_width,
    _cells,
    _colored,
    _legend,
    _width,
    count,
    gib_cell,
    print_table,
    say,
)

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


def bar(r: RankLedger, width: int = BAR_CELLS) -> List[Segment]:
    """Segments across the memory that was free before loading."""
    total = r.target.pre_load_avail_bytes or 0
    if total <= 0:
        return []
    segments = []
    for label, get, _, colour in LEDGER_ROWS:
        value = get(r)
        if colour is None or not value or value <= 0:
            continue
        segments.append((label, value, colour, LEDGER_GLYPHS[label]))
    return _cells(segments, total, width)



def render(c: Any, a: Analysis) -> None:
    """The startup's evidence: header, ledger, bars, reserve (findings are the caller's)."""
    header(c, a)
    groups = collapse(a.ranks)
    if groups:
        _ledger_tables(c, a, groups)
    if any(r.target.pre_load_avail_bytes for _, r in groups):  # a bar needs the memory it splits
        rank_bars(c, groups, a.complete)
    _reserve_table(c, a)


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
        out.append((fit.rank_label(names) if len(names) > 1 else names[0], members[0]))
    return out


def _source(r: RankLedger, key: str) -> str:
    if key.startswith("draft."):
        return r.draft.sources.get(key[6:], "") if r.draft else ""
    return r.sources.get(key) or r.target.sources.get(key, "")


def header(c: Any, a: Analysis) -> None:
    args = a.server_args
    facts = ["SGLang {} (from line formats)".format(a.era.hint)]
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
    say(c, " · ".join(facts))
    s = a.summary
    if s.max_total_num_tokens is not None:
        say(c, "KV tokens {:,} · max_running_requests {} · context_len {} · free after startup {} GiB ({})".format(
            s.max_total_num_tokens, count(s.max_running_requests), count(s.context_len),
            gib_cell(s.startup_avail_bytes), s.source), indent=2)
    for p in a.problems:
        say(c, "{}: {}".format(p.code, p.message), indent=4, first="  !", style="yellow", first_style="yellow")


def brief(a: Analysis) -> List[str]:
    """The startup in two sentences for the one-screen report: release, model, parallelism and the
    budget flag; then the KV pool and what it holds."""
    args = a.server_args
    facts = ["SGLang {}".format(a.era.hint)]
    if args.get("model_path"):
        facts.append(str(args["model_path"]).rstrip("/").rsplit("/", 1)[-1])
    tp = args.get("tp_size")
    facts.append("TP{}".format(tp) if tp else "{} rank(s)".format(len(a.ranks)))
    if a.budget.mfs is not None:
        facts.append("--mem-fraction-static {:g}{}".format(a.budget.mfs, "" if a.server_args_source else
                                                           " (back-solved)"))
    if args.get("speculative_algorithm"):
        facts.append(str(args["speculative_algorithm"]))
    s = a.summary
    if s.max_total_num_tokens is None:
        return [" · ".join(facts)]
    pool = "KV pool {:,} tokens per rank · max_running_requests {} · context_len {}".format(
        s.max_total_num_tokens, count(s.max_running_requests), count(s.context_len))
    if s.startup_avail_bytes is not None:
        pool += " · {} GiB free after startup".format(gib_cell(s.startup_avail_bytes))
    return [" · ".join(facts), pool]


def ledger_rows(a: Analysis, groups: List[Tuple[str, RankLedger]]) -> List[List[str]]:
    """[item, one value per group, source of the first group] per row of the ledger."""
    rows = []
    for label, get, key, _ in LEDGER_ROWS:
        values = [get(r) for _, r in groups]
        if all(v is None for v in values):
            continue
        if key == "final_avail_bytes" and not a.complete:  # a fragment's last figure is not "after startup"
            label = "last free figure seen"
        rows.append([label] + [gib_cell(v) for v in values] + [_source(groups[0][1], key)])
    r0 = groups[0][1]
    if r0.target.kv_tokens is not None:
        rows.append(["KV tokens"] + [count(r.target.kv_tokens) for _, r in groups]
                    + [r0.target.sources.get("kv_tokens", "")])
    if a.budget.cell_bytes:
        rows.append(["KV bytes per token"] + ["{:,}".format(a.budget.cell_bytes) for _ in groups]
                    + [a.budget.cell_source])
    if r0.reserve_bytes is not None:
        rows.append(["reserve (1 − mfs) × pre-load free"] + [gib_cell(r.reserve_bytes) for _, r in groups]
                    + ["formula: " + a.budget.mfs_source])
    return rows


def _ledger_tables(c: Any, a: Analysis, groups: List[Tuple[str, RankLedger]]) -> None:
    """The ledger, one column per group of identical ranks; when the groups do not fit beside the
    item names, as several tables of as many groups as fit (sources with the first)."""
    rows = ledger_rows(a, groups)
    if not rows:  # ranks whose log has no memory figure yet (a hang at distributed init): nothing to tabulate
        return
    item_width = max(fit.cell_len(r[0]) for r in rows)
    value_width = max(fit.cell_len(x) for r in rows for x in r[1:-1] + [label for label, _ in groups])
    per_table = max(1, (_width(c) - item_width - fit.MARKER_WIDTH - fit.SEPARATOR) // (value_width + fit.SEPARATOR))
    title = "Memory ledger per rank (GiB; 1 GiB = 2^30 B; SGLang's \"GB\" is GiB)"
    for start in range(0, len(groups), per_table):
        chunk = range(start, min(len(groups), start + per_table))
        columns = [Col("item")] + [Col(groups[i][0], "right") for i in chunk]
        if start == 0:
            columns.append(Col("source ({})".format(groups[0][0]), priority=10, give=NOTES, style="dim",
                               short="source"))
        body = [[r[0]] + [r[1 + i] for i in chunk] + ([r[-1]] if start == 0 else []) for r in rows]
        print_table(c, title if start == 0 else None, columns, body)


def rank_bars(c: Any, groups: List[Tuple[str, RankLedger]], complete: bool) -> None:
    from rich.text import Text

    c.print(Text("Where each GPU's pre-load free memory went:", style="bold"))
    label_width = max(fit.cell_len(label) for label, _ in groups)
    suffixes = [" {} GiB".format(gib_cell(r.target.pre_load_avail_bytes)) for _, r in groups]
    cells = _bar_width(c, label_width, max(fit.cell_len(s) for s in suffixes))
    seen: List[str] = []
    leftover = False
    for (label, r), suffix in zip(groups, suffixes):
        segs = bar(r, cells)
        leftover = leftover or sum(s.cells for s in segs) < cells
        seen += [s.label for s in segs if s.label not in seen]
        c.print(_bar_text(label, label_width, segs, cells, suffix, _colored(c), FREE_CELL), no_wrap=True,
                overflow="ignore", crop=False)
    entries = [(LEDGER_GLYPHS[label], colour, label if complete or key != "final_avail_bytes" else
                "last free figure seen") for label, _, key, colour in LEDGER_ROWS if label in seen]
    if leftover:
        entries.append((FREE_CELL, None, "not accounted for"))
    _legend(c, entries)


def _reserve_table(c: Any, a: Analysis) -> None:
    rows = reserve_breakdown(a) if a.complete else []
    if not rows or not a.budget.reserve_bytes:
        return
    columns = [Col("GiB", "right"), Col("item", priority=20, give=NOTES, min_width=24),
               Col("source", priority=10, give=NOTES, style="dim")]
    title = "Where the {} GiB reserve went (rank with the least free memory)".format(gib_cell(a.budget.reserve_bytes))
    print_table(c, title, columns, [[gib_cell(n), name, src] for name, n, src in rows])
