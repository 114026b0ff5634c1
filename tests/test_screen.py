"""Every shipped example and every real log, at 80 columns, in the default report and with --detail:
no line wider than the terminal, no figure cut ('0…', '139.…', '(31.44/47. …'), and the default
report on one 40-row screen with how to see the rest at its end."""

from __future__ import annotations

import json

import pytest

from kvforensics.reports.fit import CUT_FIGURE
from tests.conftest import FIXTURES, ROOT, SEED_CONFIG, run_cli

WIDTH, ROWS = 80, 40


def _is_bundle(path) -> bool:
    try:
        return str(json.loads(path.read_text(encoding="utf-8")).get("schema", "")).startswith("kvforensics.snapshot")
    except ValueError:
        return False


def _cases():
    for log in sorted((ROOT / "examples").glob("*.log")):
        extra = ["--model-config", str(SEED_CONFIG)] if log.name.startswith("kimi") else []
        yield "examples/" + log.name, ["analyze", str(log)] + extra
    for bundle in sorted((ROOT / "examples").glob("*.json")):
        if _is_bundle(bundle):
            yield "examples/" + bundle.name, ["inspect", "--from", str(bundle)]
    for log in sorted(FIXTURES.glob("real_*/*.log")):
        yield "{}/{}".format(log.parent.name, log.name[:40]), ["analyze", str(log)]


CASES = list(_cases())


@pytest.mark.parametrize("argv", [argv for _, argv in CASES], ids=[name for name, _ in CASES])
def test_every_example_and_real_log_fits_80_columns_without_a_cut_figure(argv, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    for extra in ([], ["--detail"]):
        code, out, err = run_cli(argv + extra + ["--no-color"])
        assert code in (0, 1) and "internal error" not in err, err
        lines = out.splitlines()
        wide = [x for x in lines if len(x) > WIDTH]
        assert not wide, (extra, wide)
        cut = [x for x in lines if CUT_FIGURE.search(x)]
        assert not cut, (extra, cut)
        if not extra:  # the default: one screen, ending with the way to the rest
            assert len(lines) <= ROWS, "{} lines:\n{}".format(len(lines), out)
            assert "--detail" in lines[-1]


def test_the_examples_and_real_logs_are_all_here():
    names = [name for name, _ in CASES]
    assert "examples/seed-node.json" in names and "examples/vllm-node.json" in names
    assert sum(1 for n in names if n.startswith("real_")) >= 60
