"""Pinned outputs: the same input gives the same report, byte for byte, across refactors: the JSON
and the full terminal report (--detail) at 120 columns, and the default one-screen report (terminal
and Markdown) at 80.

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
    """Paths relative to the fixtures folder (the tests run from there), so the output does not
    depend on where the checkout lives (a longer path would wrap the terminal text differently)."""
    name = path.name
    rel = str(path.relative_to(FIXTURES))
    if name.startswith("snap-"):
        return ["inspect", "--from", rel]
    m = re.search(r"\.startup(-?\d+)\.log$", name)
    argv = ["analyze", rel] + (["--startup", m.group(1)] if m else [])
    if name.startswith("kimi"):
        argv += ["--model-config", os.path.relpath(str(SEED_CONFIG), str(FIXTURES))]
    return argv


def _outputs(path: Path) -> dict:
    """The JSON and the full terminal report (--detail) at 120 columns."""
    argv = _argv(path)
    code, out, err = run_cli(argv + ["--json"])
    tcode, text, _ = run_cli(argv + ["--no-color", "--detail"])
    return {"argv": argv, "exit": code, "stderr": err, "json": json.loads(out) if out else None,
            "terminal_exit": tcode, "terminal": text.splitlines()}


@pytest.mark.parametrize("path", INPUTS, ids=[p.name for p in INPUTS])
def test_same_output_as_pinned(path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.chdir(FIXTURES)
    got = _outputs(path)
    expected_file = GOLDEN / "expected" / (path.name + ".json")
    if REGEN:
        expected_file.write_text(json.dumps(got, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    expected = json.loads(expected_file.read_text(encoding="utf-8"))
    assert got["exit"] == expected["exit"]
    assert got["json"] == expected["json"]
    assert got["terminal"] == expected["terminal"]


SHORT = GOLDEN / "short"


@pytest.mark.parametrize("path", INPUTS, ids=[p.name for p in INPUTS])
def test_the_one_screen_report_as_pinned(path, monkeypatch):
    """The default report, at 80 columns: the terminal's, then the Markdown's, as plain text files (a
    change shows as a readable diff)."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(FIXTURES)
    argv = _argv(path)
    _, text, _ = run_cli(argv + ["--no-color"])
    _, markdown, _ = run_cli(argv + ["--format", "markdown"])
    got = "$ kvforensics {}\n{}\n$ kvforensics {} --format markdown\n{}".format(
        " ".join(argv), text, " ".join(argv), markdown)
    expected_file = SHORT / (path.name + ".txt")
    if REGEN:
        SHORT.mkdir(exist_ok=True)
        expected_file.write_text(got, encoding="utf-8")
    assert got == expected_file.read_text(encoding="utf-8")
