"""The complexity gate of ``make lint``: radon's cyclomatic complexity of every function in the package.

ruff's mccabe check (C90, max 20) counts branches only; radon also counts ``and``/``or``, conditional
expressions and comprehensions, so a function can pass ruff and still be hard to follow. The gate
fails when any function (method, closure) in agent/, collectors/ or reports/ is over LIMIT, or when
more than MAX_OVER_SOFT are over SOFT, and prints the offenders, worst first.

    python tests/complexity_gate.py [paths...]
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Iterator, List, Tuple

PATHS = ("agent", "collectors", "reports")
LIMIT = 25  # no function above this
SOFT = 20  # the refactoring target; a few functions may still sit above it
MAX_OVER_SOFT = 5

Block = Tuple[int, str]  # (complexity, "path:line name")


def _blocks(path: str, entries: List[Any], parent: str = "") -> Iterator[Block]:
    """Every function, method and closure radon reports for one file. Methods are listed both inside
    their class and on their own: only the latter are read, so none counts twice."""
    for e in entries:
        if e["type"] == "class":
            continue
        name = parent + (e["classname"] + "." if e.get("classname") else "") + e["name"]
        yield e["complexity"], "{}:{} {}".format(path, e["lineno"], name)
        yield from _blocks(path, e.get("closures", []), name + ".")


def measure(paths: Tuple[str, ...]) -> List[Block]:
    """(complexity, where) of every block under ``paths``, most complex first."""
    out = subprocess.run([sys.executable, "-m", "radon", "cc", "--json", *paths], check=True,
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    blocks: List[Block] = []
    for path, entries in sorted(json.loads(out).items()):
        if isinstance(entries, dict):  # radon could not parse the file
            raise SystemExit("complexity gate: radon failed on {}: {}".format(path, entries.get("error")))
        blocks.extend(_blocks(path, entries))
    return sorted(blocks, key=lambda b: (-b[0], b[1]))


def main(argv: List[str]) -> int:
    paths = tuple(argv) or PATHS
    blocks = measure(paths)
    over_limit = [b for b in blocks if b[0] > LIMIT]
    over_soft = [b for b in blocks if b[0] > SOFT]
    failed = bool(over_limit) or len(over_soft) > MAX_OVER_SOFT
    if failed:
        print("complexity gate FAILED (radon cc): no function may be over {}, at most {} over {}".format(
            LIMIT, MAX_OVER_SOFT, SOFT))
    for complexity, where in over_soft:
        mark = "over {}".format(LIMIT) if complexity > LIMIT else "over {}".format(SOFT)
        print("  {:>3}  {}  ({})".format(complexity, where, mark))
    if not failed:
        print("complexity gate ok: {} functions in {}, {} over {} (at most {}), none over {}".format(
            len(blocks), " ".join(paths), len(over_soft), SOFT, MAX_OVER_SOFT, LIMIT))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
