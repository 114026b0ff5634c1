"""reports/fit.py: a table that does not fit gives way by whole columns and headers, never by a
figure; prose that must be cut is cut after a word, never inside or right after a figure."""

from __future__ import annotations

import re

from kvforensics.reports import fit
from kvforensics.reports.fit import NOTES, Col

CUT_FIGURE = fit.CUT_FIGURE


def _shown(fitted):
    return [cell for row in fitted.rows for cell in row]


def test_required_columns_too_wide_take_their_short_headers_spelt_out_below():
    columns = [Col("worker", priority=40, give=NOTES)] + [Col("activation peak", "right", short="act.")] + [
        Col("column {}".format(i), "right") for i in range(6)]
    rows = [["Worker_TP0 pid=18303", "5.10"] + ["139.80"] * 6]
    fitted = fit.fit_table(columns, rows, 80)
    assert fit.table_width(fitted) <= 80
    assert [c.header for c in fitted.columns][1] == "act."
    assert ("headers:", "act. = activation peak") in fitted.notes
    assert "5.10" in _shown(fitted) and _shown(fitted).count("139.80") == 6


def test_a_table_whose_required_columns_cannot_fit_is_split_with_its_first_column_in_each():
    columns = [Col("item")] + [Col("value number {}".format(i), "right") for i in range(8)]
    rows = [["free before weights load", "94.04", "72.33", "10.42", "0.06", "0.63", "1.43", "2.31", "139.80"]]
    parts = fit.fit_tables(columns, rows, 80)
    assert len(parts) > 1
    for part in parts:
        assert fit.table_width(part) <= 80 and part.columns[0].header == "item"
        assert part.rows[0][0] == "free before weights load"
    shown = [cell for part in parts for cell in part.rows[0][1:]]
    assert shown == rows[0][1:]  # every figure, whole, in order


def test_a_table_that_fits_is_one_table():
    columns = [Col("a"), Col("b", "right")]
    assert len(fit.fit_tables(columns, [["x", "1.00"]], 80)) == 1


def test_footnoted_cells_keep_whole_figures():
    text = "free memory on device (31.44/47.92 GiB) below the desired 0.9 × 47.92 GiB"
    for width in range(8, len(text)):
        head = fit.first_words(text, width)
        assert not re.search(r"\d[./,]$", head), (width, head)


def test_clipped_prose_never_ends_in_a_figure():
    texts = ["free GPU memory at worker start was below total × gpu_memory_utilization: ValueError: Free "
             "memory on device (31.44/47.92 GiB) on startup is less than desired GPU memory utilization",
             "the profiled value instead. (DP0 TP0 line 2); last free figure 21.73 GiB of 80.00 GiB on every rank",
             "ray::RayWorkerWrapper.execute_method() (pid=7106, ip=192.168.10.10, actor_id=0123456789abcdef) failed",
             "nvml.process_list_corrupt: GPU 3,5: nvmlDeviceGetComputeRunningProcesses_v3 returned a corrupt list"]
    for text in texts:
        for width in range(30, 90, 7):
            lines = fit.clip(text, width, 2)
            assert len(lines) <= 2 and all(fit.cell_len(x) <= width for x in lines)
            assert not CUT_FIGURE.search(lines[-1]), (width, lines)
            assert all(w == "…" or w in text for line in lines for w in line.split())  # nothing invented


def test_the_figure_pattern_tells_figures_from_names():
    for cut in ("0…", "139.…", "54.…", "(31.44/47. …", "ip=192.168.10.10, …", "21.73 …"):
        assert fit.CUT_FIGURE.search(cut), cut
    for whole in ("TP0 …", "Info_v2 …", "GiB …", "line …"):
        assert not fit.CUT_FIGURE.search(whole), whole


def test_a_figure_and_its_unit_wrap_as_one_word():
    """Piped into a ticket at 80 columns the seed's cause read "CUDA graphs (1.43" / "GiB)": never again."""
    from kvforensics.reports.fit import wrap

    text = "It paid for the EAGLE3 draft (3.52 GiB), CUDA graphs (1.43 GiB) and workspaces (0.69 GiB); +45,981 tokens"
    for width in range(20, 90):
        lines = wrap(text, width)
        assert " ".join(lines) == text
        for a, b in zip(lines, lines[1:]):
            assert not (a.split()[-1][-1:].isdigit() and b.split()[0].startswith(("GiB", "tokens"))), (width, a, b)


def test_a_piped_report_fits_80_columns_without_columns_set(monkeypatch):
    """Into less, a ticket or tee, with no COLUMNS: the width every report fits, not 120."""
    from tests.conftest import run_cli

    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, err = run_cli(["inspect", "--from", "examples/seed-node.json", "--no-color"])
    assert max(len(line) for line in out.splitlines()) <= 80
