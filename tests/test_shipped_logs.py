"""Every real log, as it reaches us through what shipped it, gives the report it gives unwrapped.

Each excerpt of ``fixtures/real_sglang/``, ``fixtures/real_vllm/`` and ``examples/`` is wrapped as
a container runtime's CRI file (lines over 512 bytes split into partial records, stdout and stderr
interleaved), as ``kubectl logs --timestamps`` prints it, coloured as vLLM colours a terminal,
pasted with ``>> ``, and all of those but CRI at once (``tests/shippers.py``). ``analyze --json``
must give the same document: the same findings, figures, verdict and evidence. Byte offsets move
with the prefixes and are left out; a CRI file's line numbers count its records, so they are
mapped back to the excerpt's lines before comparing; the reader's own notes are left out (a CRI
file's says that lines were joined, and is checked apart).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

from tests import shippers
from tests.conftest import FIXTURES, ROOT, run_cli

LOGS = (sorted((FIXTURES / "real_sglang").glob("*.log")) + sorted((FIXTURES / "real_vllm").glob("*.log"))
        + sorted((ROOT / "examples").glob("*.log")))


def _without_offsets(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _without_offsets(v) for k, v in x.items() if k != "offset"}
    if isinstance(x, list):
        return [_without_offsets(v) for v in x]
    return x


def _renumbered(x: Any, lines: Dict[int, int], key: str = "") -> Any:
    """A CRI report with each record number replaced by the excerpt's line number."""
    if isinstance(x, dict):
        return {k: _renumbered(v, lines, k) for k, v in x.items()}
    if isinstance(x, list):
        return [_renumbered(v, lines) for v in x]
    if isinstance(x, str):
        return re.sub(r"\bline (\d+)", lambda m: "line {}".format(lines.get(int(m.group(1)), m.group(1))), x)
    if key in ("line", "first_line") and isinstance(x, int):
        return lines.get(x, -x)  # a record no line begins at: never equal
    return x


def _report(path: Path, lines: Optional[Dict[int, int]] = None) -> Dict[str, Any]:
    code, out, err = run_cli(["analyze", str(path), "--json"])
    assert code in (0, 1), "exit {}: {}".format(code, err)
    target = json.loads(out)["targets"][0]
    target.pop("target")
    target["reader_notes"] = [p["message"] for p in target["problems"] if p["code"] == "log.reader"]
    target["problems"] = [p for p in target["problems"] if p["code"] != "log.reader"]
    target = _without_offsets(target)
    return target if lines is None else _renumbered(target, lines)


@lru_cache(maxsize=None)
def _unwrapped(log: Path) -> str:
    return json.dumps(_report(log), sort_keys=True)


@pytest.mark.parametrize("wrapping", sorted(shippers.WRAPPINGS))
@pytest.mark.parametrize("log", LOGS, ids=[p.stem[:40] for p in LOGS])
def test_the_report_survives_the_shipper(tmp_path, log, wrapping):
    data = log.read_bytes()
    path = tmp_path / log.name
    lines = None
    if wrapping == "cri":
        wrapped, lines = shippers.cri_with_map(data)
    else:
        wrapped = shippers.WRAPPINGS[wrapping](data)
    path.write_bytes(wrapped)
    got = _report(path, lines)
    notes = got.pop("reader_notes")
    want = json.loads(_unwrapped(log))
    assert notes[:len(want["reader_notes"])] == want.pop("reader_notes")
    if wrapping == "cri" and re.search(rb" (?:stdout|stderr) P ", wrapped):
        assert any("(CRI) log" in n and "joined" in n for n in notes), notes
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


def test_the_corpus_is_all_here():
    assert len(LOGS) >= 60
