"""The README's and the manual's pasted reports are real output: each whole report they show (a ```text block
that opens with "kvforensics <target>") is what that command prints at 80 columns today. A change to the
report's wording shows here, and the page is updated with the change."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT, run_cli

PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
BLOCKS = [b for page in PAGES
          for b in re.findall(r"```text\n(kvforensics (?:bundle|file):.*?)```", page.read_text(encoding="utf-8"), re.S)]
COMMANDS = {
    "bundle:examples/seed-node.json": ["inspect", "--from", "examples/seed-node.json"],
    "file:examples/kimi-k2.5-tp8-eagle3.log": ["analyze", "examples/kimi-k2.5-tp8-eagle3.log", "--model-config",
                                               "examples/kimi-k2.5-config.json"],
}


def test_the_readme_and_the_manual_show_both_default_reports():
    targets = [block.split()[1] for block in BLOCKS]
    assert set(targets) == set(COMMANDS), targets


@pytest.mark.parametrize("block", BLOCKS, ids=[b.split()[1] for b in BLOCKS])
def test_a_report_in_the_readme_is_what_the_command_prints(block, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(ROOT)
    code, out, err = run_cli(COMMANDS[block.split()[1]] + ["--no-color"])
    assert out == block
