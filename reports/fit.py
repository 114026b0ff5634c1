"""Text that fits a terminal from 80 columns up without breaking a word.

Tables never wrap a cell: each column gets its natural width, and when the table is too wide
the columns give way in the order of their priority (lowest first) — a column that may be
dropped is dropped; a column whose long cells may move to footnotes keeps the first words
that fit and a marker ``[n]``, and the whole text is printed under the table as ``[n] …``.
When the required columns alone are too wide, those with a short header take it (spelt out
under the table), and failing that the table is split, its first column in each part: a figure
is never cut. Prose that must be shortened (``clip``) ends after a word, never after a figure.
Identical GPUs and ranks are collapsed by the renderers into one row (``0–7 ×8``); the label
helpers for that are here too. Pure functions of text: no rich import at module level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

SEPARATOR = 3  # " │ " between two columns (show_edge=False, pad_edge=False, padding 0 1)
REQUIRED = 1000  # a priority at or above this is never conceded
MARKER_WIDTH = 4  # "[12]"

# How a column gives way: "none" (kept whole, may be dropped unless required) or "notes"
# (keeps the words that fit, and moves the whole text to a footnote).
NONE, NOTES = "none", "notes"


def cell_len(text: str) -> int:
    from rich.cells import cell_len as measure

    return measure(text)


@dataclass
class Col:
    """One column of a table to fit: its header, and how it gives way when the table is too wide."""

    header: str
    justify: str = "left"
    priority: int = REQUIRED  # lower gives way first
    give: str = NONE
    style: Optional[str] = None
    min_width: int = 0  # for NOTES columns: the least they shrink to (the header, or a marker, if wider)
    short: str = ""  # a shorter header, used (and spelt out under the table) when the table is still too wide


@dataclass
class Fitted:
    """A table fitted to a width: the columns kept, their widths, the rows' cells as shown, and the footnotes."""

    columns: List[Col]
    widths: List[int]
    rows: List[List[str]]
    notes: List[Tuple[str, str]] = field(default_factory=list)  # ("[1]", whole text)


class Notes:
    """Footnotes under one table: identical texts share a number."""

    def __init__(self) -> None:
        self.numbers: Dict[str, int] = {}

    def marker(self, text: str) -> str:
        n = self.numbers.setdefault(text, len(self.numbers) + 1)
        return "[{}]".format(n)

    def items(self) -> List[Tuple[str, str]]:
        return [("[{}]".format(n), text) for text, n in self.numbers.items()]


def fit_table(columns: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> Fitted:
    """The columns kept, their widths, and the rows' cells as shown, for ``width`` columns.

    Columns give way by priority (dropped, or their long cells moved to footnotes); if the table is
    still too wide, the columns that have a short header take it (spelt out under the table), and
    the footnoted columns shrink to it. A cell is never cut: what is shown of it is whole words and
    a footnote marker. A table whose required columns alone are too wide is ``fit_tables``' to split."""
    cols = list(columns)
    headers = [c.header for c in cols]
    natural = [max([cell_len(h)] + [cell_len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    widths = list(natural)
    keep = [True] * len(cols)
    _give_way(cols, headers, widths, keep, width)
    short = _abbreviate(cols, headers, rows, widths, keep, width)
    if short:
        _give_way(cols, headers, widths, keep, width)
    notes = Notes()
    shown_rows = []
    for r in rows:
        shown_rows.append([_shorten(r[i], widths[i], notes) if cols[i].give == NOTES and widths[i] < natural[i]
                           else r[i] for i in range(len(cols)) if keep[i]])
    kept = [i for i in range(len(cols)) if keep[i]]
    spelt = ["{} = {}".format(cols[i].short, cols[i].header) for i in kept if i in short]
    return Fitted([replace(cols[i], header=headers[i]) for i in kept], [widths[i] for i in kept], shown_rows,
                  notes.items() + ([("headers:", "; ".join(spelt))] if spelt else []))


def _give_way(cols: List[Col], headers: List[str], widths: List[int], keep: List[bool], width: int) -> None:
    """Columns not required give way, lowest priority first, until the table fits: a NOTES column
    shrinks to its header (or a marker), any other is dropped."""
    for i in sorted(range(len(cols)), key=lambda j: cols[j].priority):
        over = _total(widths, keep) - width
        if over <= 0 or cols[i].priority >= REQUIRED:
            break
        if not keep[i]:
            continue
        if cols[i].give == NOTES:
            least = max(cell_len(headers[i]), MARKER_WIDTH, cols[i].min_width)
            widths[i] = min(widths[i], max(least, widths[i] - over))
        else:
            keep[i] = False


def _abbreviate(cols: List[Col], headers: List[str], rows: Sequence[Sequence[str]], widths: List[int],
                keep: List[bool], width: int) -> Set[int]:
    """Short headers, lowest priority first, while the table is too wide; the columns that took one."""
    used: Set[int] = set()
    for i in sorted(range(len(cols)), key=lambda j: cols[j].priority):
        if _total(widths, keep) <= width:
            break
        if not keep[i] or not cols[i].short or cell_len(cols[i].short) >= cell_len(headers[i]):
            continue
        headers[i] = cols[i].short
        used.add(i)
        if cols[i].give != NOTES:  # a footnoted column shrinks in the next round of giving way
            widths[i] = max([cell_len(headers[i])] + [cell_len(r[i]) for r in rows])
    return used


def fit_tables(columns: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> List[Fitted]:
    """``fit_table``; when the required columns alone are wider than ``width``, several tables, each
    with the first column and as many of the others, in order, as fit beside it."""
    fitted = fit_table(columns, rows, width)
    if table_width(fitted) <= width or len(columns) < 3:
        return [fitted]
    least = [max(cell_len(c.short or c.header), MARKER_WIDTH, c.min_width) if c.give == NOTES
             else max([cell_len(c.short or c.header)] + [cell_len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    parts: List[List[int]] = [[]]
    used = least[0]
    for i in range(1, len(columns)):
        if parts[-1] and used + SEPARATOR + least[i] > width:
            parts.append([])
            used = least[0]
        parts[-1].append(i)
        used += SEPARATOR + least[i]
    return [fit_table([columns[0]] + [columns[i] for i in part], [[r[0]] + [r[i] for i in part] for r in rows],
                      width) for part in parts]


def table_width(fitted: Fitted) -> int:
    return _total(fitted.widths, [True] * len(fitted.widths))


def _total(widths: Sequence[int], keep: Sequence[bool]) -> int:
    shown = [w for w, k in zip(widths, keep) if k]
    return sum(shown) + SEPARATOR * max(0, len(shown) - 1)


def _shorten(text: str, width: int, notes: Notes) -> str:
    """The text if it fits; else its first whole words that fit beside a footnote marker."""
    if cell_len(text) <= width:
        return text
    marker = notes.marker(text)
    head = first_words(text, width - cell_len(marker) - 1)
    return "{} {}".format(head, marker) if head else marker


def first_words(text: str, width: int) -> str:
    """The longest head of ``text`` within ``width`` cells that ends at a space or after a
    separator (``BREAKS``: 'gpu-07.' of 'gpu-07.example.org'), so no word is cut ('' if none)."""
    text = " ".join(text.split())
    best = ""
    for i, ch in enumerate(text):
        if ch == " ":
            head = text[:i]
        elif ch in BREAKS and not _inside_figure(text, i):
            head = text[:i + 1]
        else:
            continue
        if cell_len(head) > width:
            break
        best = head
    return text if cell_len(text) <= width else best


BREAKS = "/,;:=&?.)"  # a word longer than a line (a path, a URL) is broken after one of these


def _inside_figure(text: str, i: int) -> bool:
    """The separator at ``i`` joins two digits ('47.92', '31.44/47.92', '1,024'): not a place to break."""
    return 0 < i < len(text) - 1 and text[i - 1].isdigit() and text[i + 1].isdigit()


def _pieces(word: str, width: int) -> List[str]:
    """A word too long for a line, cut after separators so no run of letters is split; a run
    longer than the line itself is cut where it must."""
    pieces = []
    while cell_len(word) > width:
        cut = max((i for i, ch in enumerate(word[:width]) if ch in BREAKS), default=-1)
        cut = cut + 1 if cut > 0 else width
        pieces.append(word[:cut])
        word = word[cut:]
    return pieces + ([word] if word else [])


# A figure and the unit after it wrap as one word: "1.43" at a line's end and "GiB)" at the next one's start read
# as two things (a piped report, a ticket).
_FIGURE_WORD = re.compile(r"^[(\[~≈+−-]*\d[\d,.]*$")
_UNIT_WORD = re.compile(r"^(?:GiB|MiB|KiB|TiB|GB|MB|KB|B|tokens?|requests?|%|ms|s)(?:$|[^\w])")


def _kept_together(words: List[str]) -> List[str]:
    out: List[str] = []
    for word in words:
        if out and _FIGURE_WORD.match(out[-1]) and _UNIT_WORD.match(word):
            out[-1] += " " + word
        else:
            out.append(word)
    return out


def wrap(text: str, width: int) -> List[str]:
    """Greedy word wrap, a figure kept with its unit; a word longer than the width is cut after a separator
    (``BREAKS``)."""
    lines: List[str] = []
    line = ""
    words = [piece for word in _kept_together(text.split()) for piece in _pieces(word, width)]
    for word in words:
        candidate = word if not line else line + " " + word
        if line and cell_len(candidate) > width:
            lines.append(line)
            line = word
        else:
            line = candidate
    if line:
        lines.append(line)
    return lines


def clip(text: str, width: int, max_lines: int) -> List[str]:
    """``text`` wrapped to at most ``max_lines`` lines; when cut, the last line ends with ' …' (the
    whole text is in the report below), after a word, never after a figure: a number left without
    its unit or its other half would read as the whole of it."""
    lines = wrap(text, width)
    if len(lines) <= max_lines:
        return lines
    kept = lines[:max_lines]
    head = first_words(kept[-1] + " " + lines[max_lines], width - 2) or first_words(kept[-1], width - 2)
    last = _without_trailing_figures(head or kept[-1][:width - 2])  # a name longer than the line: cut
    kept[-1] = "…" if FIGURE_END.search(last) else last + " …"  # a line of one figure gives way to the ellipsis
    return kept


def _without_trailing_figures(line: str) -> str:
    """The line less its last words while they end in a figure ('21.73', '(line 2);', '(31.44/47.',
    'ip=10.0.0.12,'; not 'TP0' or 'Info_v2', whose digit is part of a name); never less its first word."""
    words = line.split(" ")
    while len(words) > 1 and FIGURE_END.search(words[-1]):
        words.pop()
    return " ".join(words)


FIGURE = r"(?<![A-Za-z_])\d[\d.,/:]*"  # a number, not the digits of a name
FIGURE_END = re.compile(FIGURE + r"[^\w\s]*$")
CUT_FIGURE = re.compile(FIGURE + r"\s?…")  # a figure right before an ellipsis: what a report never shows


FACTS = " · "  # between the facts of a summary line


def pack_facts(text: str, width: int) -> List[str]:
    """'a · b · c' in lines of at most ``width``, broken between facts (a line never starts with the
    separator); a fact longer than a line is wrapped at words."""
    lines: List[str] = []
    for fact in text.split(FACTS):
        if lines and cell_len(lines[-1] + FACTS + fact) <= width:
            lines[-1] += FACTS + fact
        else:
            lines += wrap(fact, width)
    return lines


def pack(items: Iterable[str], width: int, indent: int = 2, gap: int = 2) -> List[str]:
    """Short items (legend entries) side by side, never split, in lines of at most ``width``."""
    lines: List[str] = []
    line = ""
    for item in items:
        candidate = item if not line else line + " " * gap + item
        if line and indent + cell_len(candidate) > width:
            lines.append(" " * indent + line)
            line = item
        else:
            line = candidate
    if line:
        lines.append(" " * indent + line)
    return lines


# --- collapsing identical rows -------------------------------------------------------------

def ranges(numbers: Sequence[int]) -> str:
    """[0,1,2,3,5] -> '0–3,5'."""
    out: List[str] = []
    nums = sorted(numbers)
    start = prev = nums[0]
    for n in nums[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(str(start) if start == prev else "{}–{}".format(start, prev))
        if n is not None:
            start = prev = n
    return ",".join(out)


def group_label(numbers: Sequence[int]) -> str:
    """GPU indices of identical GPUs: '3', or '0–7 ×8'."""
    return str(numbers[0]) if len(numbers) == 1 else "{} ×{}".format(ranges(numbers), len(numbers))


def rank_label(tags: Sequence[Optional[str]]) -> str:
    """Rank tags of identical GPUs: 'TP3', 'TP0–TP7', 'DP1 TP0–TP3', 'TP0–1,4,6–7', or the tags
    joined by ',' when they do not share a prefix."""
    known = [t for t in tags if t]
    if not known:
        return "—"
    if len(known) == 1:
        return known[0]
    prefixes, nums = set(), []
    for t in known:
        head, sep, tail = t.rpartition("TP")
        if not sep or not tail.isdigit():
            return ",".join(known)
        prefixes.add(head)
        nums.append(int(tail))
    head = prefixes.pop() if len(prefixes) == 1 else None
    if head is None:
        return ",".join(known)
    if nums == list(range(nums[0], nums[0] + len(nums))):
        return "{}TP{}–TP{}".format(head, nums[0], nums[-1])
    return "{}TP{}".format(head, ranges(nums))  # 'TP0–1,4,6–7


def collapse_rows(keys: Sequence[Tuple], members: Sequence[int]) -> List[List[int]]:
    """Positions grouped by identical key, in first-seen order."""
    groups: Dict[Tuple, List[int]] = {}
    for key, m in zip(keys, members):
        groups.setdefault(key, []).append(m)
    return list(groups.values())
