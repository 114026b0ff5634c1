"""Trim a module to the top-level definitions a set of names needs (the probe's copy of pynvml).

nvidia-ml-py's ``pynvml.py`` is 8,000 lines binding all of NVML; the probe calls about twenty of its
functions. Shipped whole it was ~40 KB of the probe's 75 KB xz stream and ~34 ms of every GPU host's CPU
to compile. ``shake`` keeps every top-level statement that is not a definition (imports, module-level
calls, ``if``/``try`` blocks), and of the definitions (``def``, ``class``, assignments) those reachable
from ``roots`` through the names the kept statements mention, to a fixed point. A name is counted as
mentioned when it appears as a name or as an attribute anywhere in a kept statement: that over-keeps
(``x.nvmlFoo`` keeps a module-level ``nvmlFoo``), never under-keeps. Dropped statements become blank
lines, so every kept line stays where it was and a traceback from a host still names pynvml's own line.

What static reachability cannot see is named by the caller: ``keep_prefixes`` keeps every definition
of a name with one of these prefixes (pynvml turns each ``NVML_ERROR_*`` constant into an exception
class by scanning ``dir()`` of its own module at import).
"""

from __future__ import annotations

import ast
from typing import Iterable, List, Optional, Set, Tuple


def _defined(stmt: ast.stmt) -> Optional[Set[str]]:
    """The names a definition binds; None for a statement that is not a definition (always kept)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return None


def _mentioned(stmt: ast.stmt) -> Set[str]:
    out = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
    return out


def _span(stmt: ast.stmt) -> Tuple[int, int]:
    """First and last line (1-based) of a statement, its decorators included."""
    first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
    return first, stmt.end_lineno or stmt.lineno


def kept_statements(tree: ast.Module, roots: Iterable[str], keep_prefixes: Tuple[str, ...] = ()) -> List[bool]:
    """For each top-level statement of ``tree``: is it kept?"""
    body = tree.body
    defines = [_defined(s) for s in body]
    mentions = [_mentioned(s) for s in body]
    kept = [d is None or any(n.startswith(keep_prefixes) for n in d) for d in defines]  # startswith(()): False
    needed = set(roots)
    grew = True
    while grew:
        grew = False
        for i, names in enumerate(defines):
            if not kept[i] and names and names & needed:
                kept[i] = grew = True
        for i, names in enumerate(mentions):
            if kept[i] and not names <= needed:
                needed |= names
                grew = True
    return kept


def shake(source: str, roots: Iterable[str], keep_prefixes: Tuple[str, ...] = ()) -> str:
    """``source`` with the definitions nothing in ``roots`` reaches blanked, line for line."""
    tree = ast.parse(source)
    kept = kept_statements(tree, roots, keep_prefixes)
    lines = source.splitlines(keepends=True)
    keep_line = [False] * (len(lines) + 1)
    for stmt, keep in zip(tree.body, kept):
        if keep:
            first, last = _span(stmt)
            for n in range(first, last + 1):
                keep_line[n] = True
    # A line that also holds a dropped statement (``a = 1; b = 2``) is kept whole: harmless over-keeping.
    return "".join(line if keep_line[n] else "\n" for n, line in enumerate(lines, start=1))
