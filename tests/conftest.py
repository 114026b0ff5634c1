"""Shared helpers: paths, running the CLI in-process, and building logs."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SEED_LOG = ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log"
SEED_CONFIG = ROOT / "examples" / "kimi-k2.5-config.json"
GIB = 1 << 30


def gib(x: float) -> int:
    """Bytes for a figure SGLang printed as x "GB" (which is GiB)."""
    return int(round(x * GIB))


def run_cli(argv: List[str], stdin: Optional[bytes] = None) -> Tuple[int, str, str]:
    """Run kvforensics in-process; return (exit code, stdout, stderr)."""
    from agent.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr = out, err
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        code = main(argv)
    finally:
        sys.stdout, sys.stderr, sys.stdin = old
    return code, out.getvalue(), err.getvalue()


def run_json(argv: List[str]) -> Tuple[int, dict]:
    code, out, err = run_cli(argv + ["--json"])
    assert out, err
    return code, json.loads(out)


@pytest.fixture
def seed_json() -> dict:
    code, doc = run_json(["analyze", str(SEED_LOG), "--model-config", str(SEED_CONFIG)])
    assert code == 1  # warnings present, default --fail-on warning
    return doc["targets"][0]
