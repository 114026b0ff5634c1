"""Pasteable reports: distinct bar glyphs without colour, --format markdown, --json as --format json."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ROOT, SEED_CONFIG, SEED_LOG, run_cli

SEED_NODE = ROOT / "examples" / "seed-node.json"
ANALYZE = ["analyze", str(SEED_LOG), "--model-config", str(SEED_CONFIG)]
INSPECT = ["inspect", "--from", str(SEED_NODE)]
DETAIL = ["--detail"]  # the bars, the ledger and each finding in full are the full report's


def _bars(text, title):
    lines = text.splitlines()
    start = lines.index(next(x for x in lines if x.startswith(title))) + 1
    return lines[start:start + 4]


def test_without_colour_each_item_has_its_own_glyph_and_a_legend():
    code, out, err = run_cli(ANALYZE + DETAIL + ["--no-color"])
    bars = _bars(out, "Where each GPU's pre-load free memory went")
    tp0 = bars[0].split()[1]
    assert set(tp0) >= {"W", "K", "G", "d", "g", "."} and "█" not in out
    for glyph, label in (("W", "weights"), ("K", "KV pool"), ("G", "CUDA graphs"), ("d", "draft weights"),
                         ("g", "draft CUDA graphs"), (".", "free after startup")):
        assert "{} {}".format(glyph, label) in out
    code, out, err = run_cli(INSPECT + ["-v", "--no-color"])
    node = _bars(out, "Where each GPU's memory is now")[0]
    assert node.startswith("  GPU 0–7 ×8 W") and "K" in node and "D" in node


def test_no_color_environment_gives_the_same_glyphs(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    code, out, err = run_cli(ANALYZE + DETAIL)
    assert "\x1b[" not in out and "W weights" in out


def test_with_colour_the_bars_are_blocks():
    code, out, err = run_cli(ANALYZE + DETAIL + ["--color"])
    assert "█" in out and "\x1b[" in out


def test_markdown_for_analyze():
    code, out, err = run_cli(ANALYZE + DETAIL + ["--format", "markdown"])
    assert code == 1 and not err and "\x1b[" not in out
    assert out.startswith("## kvforensics `file:")
    assert "**Why is the KV cache 10.42 GiB per rank (159,277 tokens)?**" in out
    assert "- **Action:** --mem-fraction-static 0.915" in out
    assert "| item | TP0 | TP1–TP7 | source (TP0) |" in out and "|---|---:|---:|---|" in out
    assert re.search(r"```text\n +TP0 W+K+", out)  # the bars, as glyphs, in a code block
    assert "1. `--mem-fraction-static 0.915` (estimated)" in out
    assert out.index("**Why is the KV cache") < out.index("### Evidence") < out.index("### Findings")


def test_markdown_for_inspect_collapses_gpus():
    for extra in ([], DETAIL):
        code, out, err = run_cli(INSPECT + extra + ["--format", "markdown"])
        assert code == 1 and "\x1b[" not in out
        assert "| 0–7 ×8 | RTX PRO 6000 Blackwell Server Edition | TP0–TP7 |" in out
        assert "**Where did the GPU memory go? Why is the KV cache 10.42 GiB per rank?**" in out


def test_markdown_is_short_by_default_and_full_with_detail():
    """The same split as the terminal's: the verdict with the unused memory, each finding and
    recommendation in a line, and how to see the rest; --detail is the report in full."""
    for argv in (ANALYZE, INSPECT):
        code, short, err = run_cli(argv + ["--format", "markdown"])
        code, full, err = run_cli(argv + DETAIL + ["--format", "markdown"])
        # the reserve taken before the weights loaded is the cause, the unused memory its proof: no separate
        # memory line repeats it
        cause = short.split("- **Cause:** ")[1].splitlines()[0]
        assert cause.startswith("SGLang takes its (1 − 0.88) reserve from the 94.04 GiB free before the weights load")
        assert "margin (--margin's default) = " in short.split("- **Proof:** ")[1].splitlines()[0]
        assert "- **Memory:** " not in short
        assert "- **WARNING** The draft model (LlamaForCausalLMEagle3) took 3.52 GiB out of the reserve" in short
        assert "1. `--mem-fraction-static 0." in short and "add `--detail`" in short.splitlines()[-1]
        assert "```text" not in short and "### Evidence" not in short and "evidence:" not in short
        assert "```text" in full and "### Evidence" in full and "*evidence:*" in full
        assert "add `--detail`" not in full and len(short.splitlines()) < len(full.splitlines()) / 2


def test_markdown_fleet_table():
    from kvforensics.agent.model.live import TargetFailure
    from kvforensics.agent.model.reconcile import inspect_snapshot
    from kvforensics.agent.model.records import Options
    from kvforensics.agent.remote import bundles
    from kvforensics.reports import markdown

    insp = inspect_snapshot(bundles.load(str(SEED_NODE)), "ssh:gpu-07", Options())
    out = markdown.render_fleet([insp, TargetFailure("ssh:gpu|08", "unreachable", "ssh.unreachable",
                                                     "connection refused | timed out")])
    assert "| gpu-07 | ok | 8 | SGLang 0.5.6–0.5.8 | Kimi-K2.5-INT4 | 159,277 | 3.06 |" in out
    assert "| gpu\\|08 | unreachable |" in out  # a pipe inside a cell is escaped
    assert "connection refused" not in out  # a failure's reason is said once, on stderr


@pytest.mark.parametrize("argv", [ANALYZE, INSPECT])
def test_json_is_an_alias_of_format_json(argv):
    code1, out1, _ = run_cli(argv + ["--json"])
    code2, out2, _ = run_cli(argv + ["--format", "json"])
    assert code1 == code2 and json.loads(out1) == json.loads(out2)


@pytest.mark.parametrize("extra,message", [(["--format", "yaml"], "--format must be one of"),
                                           (["--format", "markdown", "--json"], "--json is --format json")])
def test_bad_format_is_a_usage_error(extra, message):
    for argv in (ANALYZE, INSPECT):
        code, out, err = run_cli(argv + extra)
        assert code == 2 and message in err
