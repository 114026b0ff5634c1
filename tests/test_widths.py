"""Every report kind fits 80 and 120 columns: no line is wider, and no word is split across lines.

The words of a narrow rendering are checked against the words of the same report rendered too
wide to wrap at all: a word cut in two ("Black" / "well") is not a word there. Bars and
sparklines are drawn to the width, so their cells are left out of the comparison.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace

import pytest

from tests.conftest import FIXTURES, ROOT, SEED_CONFIG, SEED_LOG

INPUTS = FIXTURES / "golden" / "inputs"
WIDTHS = (80, 120)
UNWRAPPED = 1000
ANSI = re.compile(r"\x1b\[[0-9;]*m")
WORD = re.compile(r"[A-Za-z0-9_]+")
BAR = re.compile(r"^[WKMTAGdkgueDEOFXNR.░█]{10,}$")  # a bar's cells: drawn to the width, not words
MARKER = re.compile(r"^\[\d+\]$")  # a footnote's number: only where a column gave way
EDGE = "│┃ "


def _analysis(log, config=None):
    from kvforensics.agent.model.analyze import analyze_startup
    from kvforensics.agent.model.records import Options
    from kvforensics.collectors.logfile import read_log
    from kvforensics.collectors.model_config import load_model_config

    opts = Options(model_config=load_model_config(str(config)) if config else None)
    excerpt = read_log(str(log), -1)
    return analyze_startup(excerpt.startup, "file:" + log.name, opts, excerpt.index, excerpt.count, excerpt.notes)


def _inspection(bundle, target=None):
    from kvforensics.agent.model.reconcile import inspect_snapshot
    from kvforensics.agent.model.records import Options
    from kvforensics.agent.remote import bundles

    return inspect_snapshot(bundles.load(str(bundle)), target or "bundle:" + bundle.name, Options())


def analyze_complete(width, color):
    from kvforensics.reports import terminal

    return terminal.render([_analysis(SEED_LOG, SEED_CONFIG)], color, width)


def analyze_fragment(width, color):
    from kvforensics.reports import terminal

    return terminal.render([_analysis(INPUTS / "log-71806c9814120be0.startup-1.log")], color, width)


def analyze_failed(width, color):
    from kvforensics.reports import terminal

    failed = [_analysis(INPUTS / name) for name in ("log-150aa9b4949e7c8e.startup-1.log",
                                                    "log-0da4e6acbf4187a1.startup-1.log")]
    return terminal.render(failed, color, width)


def inspect_seed(width, color):
    from kvforensics.reports import terminal

    return terminal.render_inspections([_inspection(ROOT / "examples" / "seed-node.json")], color, width)


def inspect_troubled_nodes(width, color):
    """A lost GPU, memory held by a dead PID, foreign processes: GPUs that do not collapse."""
    from kvforensics.reports import terminal

    nodes = [_inspection(INPUTS / name) for name in ("snap-26058c2deed84b44.bundle.json",
                                                     "snap-63dee743c452eb36.bundle.json",
                                                     "snap-ec41c30cd51cee6d.bundle.json")]
    return terminal.render_inspections(nodes, color, width)


def fleet(width, color):
    from kvforensics.agent.model.live import TargetFailure
    from kvforensics.reports import terminal

    seed = ROOT / "examples" / "seed-node.json"
    results = [
        _inspection(seed, "ssh:gpu-node-07.cluster.example.internal"),
        _inspection(INPUTS / "snap-63dee743c452eb36.bundle.json", "ssh:gpu-08"),
        TargetFailure("ssh:gpu-09", "host_key_refused", "ssh.host_key_changed",
                      "the host key of gpu-09 differs from the one recorded in ~/.ssh/known_hosts: possible "
                      "man-in-the-middle; if the host was reinstalled, run ssh-keygen -R gpu-09"),
        TargetFailure("ssh:root@10.0.0.12:2222", "unreachable", "ssh.unreachable", "connection refused"),
        _inspection(INPUTS / "snap-06d958a828b0fb24.bundle.json", "ssh:cpu-only-box"),
    ]
    return terminal.render_fleet(results, color, width)


def history(width, color):
    from kvforensics.agent.history import store as h
    from kvforensics.reports import history_report

    path = str(_HISTORY["dir"] / "h.db")
    opened = h.open_db(path)
    try:
        start = time.time() - 3600
        rid = h.upsert_run(opened.conn, "boot-1/1234/99", start, engine="sglang-30000", model="Kimi-K2.5-INT4")
        for i, free in enumerate((5.06, 3.71, 5.06, 4.2)):
            h.upsert_run(opened.conn, "boot-1/1234/99", start + i * 900)
            gpus = [{"gpu": g, "rank": "TP{}".format(g), "free_bytes": int((free if g != 4 else free - 1) * (1 << 30))}
                    for g in range(8)]
            h.add_sample(opened.conn, rid, start + i * 900, True, gpus,
                         {"kv_tokens": 159277, "used_tokens": 120000 + i, "token_usage": 0.75})
        runs = [h.run_stats(opened.conn, rid)]
        plots = {g: [v for _, v in h.series(opened.conn, g)] for g in range(8)}
    finally:
        opened.conn.close()
    return history_report.render(path.replace(str(_HISTORY["dir"]), "/var/lib/kvforensics"), "7d", runs, plots,
                                 color, width)


def analyze_short(width, color):
    """The default report: the answer on one screen."""
    from kvforensics.reports import terminal

    analyses = [_analysis(SEED_LOG, SEED_CONFIG), _analysis(INPUTS / "log-71806c9814120be0.startup-1.log"),
                _analysis(INPUTS / "log-150aa9b4949e7c8e.startup-1.log")]
    return terminal.render(analyses, color, width, detail=False)


def inspect_short(width, color):
    from kvforensics.reports import terminal

    nodes = [_inspection(ROOT / "examples" / "seed-node.json"), _inspection(ROOT / "examples" / "vllm-node.json"),
             _inspection(INPUTS / "snap-26058c2deed84b44.bundle.json")]
    return terminal.render_inspections(nodes, color, width, detail=False)


_HISTORY = {}
REPORTS = [analyze_complete, analyze_fragment, analyze_failed, inspect_seed, inspect_troubled_nodes, fleet, history,
           analyze_short, inspect_short]


@pytest.fixture(autouse=True)
def _history_dir(tmp_path):
    _HISTORY["dir"] = tmp_path


def _words(text):
    out = set()
    for token in text.split():
        if not BAR.match(token) and not MARKER.match(token):
            out.update(WORD.findall(token))
    return out


def _edges(line):
    stripped = line.strip(EDGE)
    head = re.match(r"[A-Za-z0-9_]+", stripped)
    tail = re.search(r"[A-Za-z0-9_]+$", stripped)
    return (head.group(0) if head else "", tail.group(0) if tail else "")


@pytest.mark.parametrize("color", [False, True], ids=["plain", "colour"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("report", REPORTS, ids=[r.__name__ for r in REPORTS])
def test_fits_without_breaking_words(report, width, color):
    from rich.cells import cell_len

    text = ANSI.sub("", report(width, color))
    vocabulary = _words(ANSI.sub("", report(UNWRAPPED, False)))
    lines = text.splitlines()
    assert len(lines) > 3
    for line in lines:
        assert cell_len(line) <= width, "{} cells: {!r}".format(cell_len(line), line)
    unknown = _words(text) - vocabulary
    assert not unknown, "words not in the unwrapped report (split or invented): {}".format(sorted(unknown))
    for above, below in zip(lines, lines[1:]):
        tail, head = _edges(above)[1], _edges(below)[0]
        if tail and head and tail + head in vocabulary:
            assert tail in vocabulary and head in vocabulary, "{!r} split across\n{}\n{}".format(tail + head, above,
                                                                                                   below)


@pytest.mark.parametrize("report", [analyze_complete, analyze_fragment, analyze_failed, inspect_seed,
                                    inspect_troubled_nodes, analyze_short, inspect_short], ids=lambda r: r.__name__)
def test_the_verdict_comes_first_in_at_most_11_lines(report):
    for width in WIDTHS:
        for one in ANSI.sub("", report(width, False)).split("\n" + "─" * width + "\n"):
            lines = one.splitlines()
            assert lines[0].startswith("kvforensics ")
            question = next(i for i, x in enumerate(lines) if x.endswith("?") or x.endswith("? …"))
            assert question <= 2  # right under the target's name (a long one may take two lines)
            verdict = lines[question:lines.index(next(x for x in lines if " evidence " in x and x.startswith("─")))]
            # the question (2), a mechanism kept whole (5), proof, action (2 each), the memory row
            assert 2 <= len(verdict) <= 11, verdict
            cause = _verdict_row(verdict, "cause")
            if len(cause) > 2:  # a mechanism: whole sentences, never cut
                assert not cause[-1].rstrip().endswith("…"), verdict


def test_identical_gpus_are_one_row_and_names_do_not_wrap():
    text = inspect_seed(80, False)
    assert "0–7 ×8" in text and "TP0–TP7" in text
    table = text[text.index("GPUs now"):text.index("Where each GPU's memory is now")]
    assert len([x for x in table.splitlines() if "│" in x]) == 1  # one row for 8 identical GPUs
    assert "RTX PRO 6000 Blackwell Server Edition" in table  # the key under the table, whole
    assert len([x for x in text.splitlines() if x.startswith("  GPU ")]) == 1  # and one bar


def test_every_golden_input_verdict_fits_11_lines_at_80_columns_its_cause_uncut():
    from kvforensics.agent.model.reconcile import inspect_snapshot
    from kvforensics.agent.model.records import Options
    from kvforensics.agent.remote import bundles
    from kvforensics.collectors.logfile import LogReadError
    from kvforensics.reports import terminal

    for path in sorted(INPUTS.iterdir()):
        for detail in (True, False):  # the full report's verdict, and the one-screen report's (its memory row)
            if path.name.startswith("snap-"):
                text = terminal.render_inspections([inspect_snapshot(bundles.load(str(path)), "b", Options())],
                                                   False, 80, detail)
            else:
                try:
                    a = _analysis(path)
                except LogReadError:  # the inputs that hold no startup: no report, no verdict
                    continue
                text = terminal.render([replace(a, target="file:x")], False, 80, detail)
            lines = text.splitlines()
            end = next(i for i, x in enumerate(lines) if x.startswith("─") and " evidence " in x)
            assert end - 1 <= 11, (path.name, lines[:end])
            cause = _verdict_row(lines[:end], "cause")
            if len(cause) > 2:  # a mechanism: whole sentences, never cut
                assert not cause[-1].rstrip().endswith("…"), (path.name, cause)


def _verdict_row(lines, label):
    """The lines of one verdict row (its label's line and the indented ones under it)."""
    out = []
    for line in lines:
        if line.startswith("  {} ".format(label)):
            out.append(line)
        elif out and line.startswith(" " * 10):
            out.append(line)
        elif out:
            break
    return out
