"""Pinned outputs: the same input gives the same report, byte for byte, across refactors.

Inputs are the logs and node snapshots the rest of the suite produces (captured once) and
the shipped example. Expected outputs were written by this test with KVF_REGEN_GOLDEN=1; a
change to any of them is a behaviour change and must be deliberate (regenerate, and say why in
the commit).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, SEED_CONFIG, run_cli

GOLDEN = FIXTURES / "golden"
INPUTS = sorted((GOLDEN / "inputs").iterdir())
REGEN = os.environ.get("KVF_REGEN_GOLDEN") == "1"


def _argv(path: Path) -> list:
    name = path.name
    if name.startswith("snap-"):
        return ["inspect", "--from", str(path)]
    m = re.search(r"\.startup(-?\d+)\.log$", name)
    argv = ["analyze", str(path)] + (["--startup", m.group(1)] if m else [])
    if name.startswith("kimi"):
        argv += ["--model-config", str(SEED_CONFIG)]
    return argv


def _outputs(path: Path) -> dict:
    argv = _argv(path)
    code, out, err = run_cli(argv + ["--json"])
    tcode, text, _ = run_cli(argv + ["--no-color"])
    # The input's own path appears in targets; pin it relative to the fixtures folder.
    rel = str(path.relative_to(FIXTURES))
    doc = json.loads(out.replace(str(path), rel)) if out else None
    return {"argv": [a.replace(str(path), rel) for a in argv], "exit": code, "stderr": err.replace(str(path), rel),
            "json": doc, "terminal_exit": tcode, "terminal": text.replace(str(path), rel).splitlines()}


@pytest.mark.parametrize("path", INPUTS, ids=[p.name for p in INPUTS])
def test_same_output_as_pinned(path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    got = _outputs(path)
    expected_file = GOLDEN / "expected" / (path.name + ".json")
    if REGEN:
        expected_file.write_text(json.dumps(got, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    expected = json.loads(expected_file.read_text(encoding="utf-8"))
    assert got["exit"] == expected["exit"]
    assert got["json"] == expected["json"]
    assert got["terminal"] == expected["terminal"]
