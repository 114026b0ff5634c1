"""Shared helpers: paths, running the CLI in-process, and building logs."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SEED_LOG = ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log"
SEED_CONFIG = ROOT / "examples" / "kimi-k2.5-config.json"
GIB = 1 << 30


def gib(x: float) -> int:
    """Bytes for a figure SGLang printed as x "GB" (which is GiB)."""
    return int(round(x * GIB))


def _check_json_contract(out: str) -> None:
    """Every JSON document the suite sees kvforensics print is strict JSON and valid against its
    published schema (agent/schemas/)."""
    text = out.strip()
    if not text.startswith("{"):
        return
    try:
        doc = json.loads(text, parse_constant=lambda c: pytest.fail("non-strict JSON constant {}".format(c)))
    except ValueError:
        return  # not one document (e.g. a pretty-printed schema is one; a progress line is not JSON)
    name = {"kvforensics.report/1": "report", "kvforensics.history/1": "history",
            "kvforensics.snapshot/1": "snapshot"}.get(doc.get("schema")) if isinstance(doc, dict) else None
    if name is not None:
        from kvforensics.agent.model import evidence

        evidence.check(name, doc)


def run_cli(argv: List[str], stdin: Optional[bytes] = None) -> Tuple[int, str, str]:
    """Run kvforensics in-process; return (exit code, stdout, stderr). JSON output is checked
    against its published schema."""
    from kvforensics.agent.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr = out, err
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        code = main(argv)
    finally:
        sys.stdout, sys.stderr, sys.stdin = old
    _check_json_contract(out.getvalue())
    return code, out.getvalue(), err.getvalue()


EACH_FORMAT = (["--json"], ["--format", "markdown"], ["--no-color"], ["--format", "oneline"])


def run_in_each_format(argv: List[str], formats: Sequence[List[str]], allowed: Tuple[int, ...]) -> List[int]:
    """Exit codes of ``argv`` in each format; fails on a code outside ``allowed`` (exit 4 is a bug), a traceback,
    a usage error of more than one line, or JSON that is not strict."""
    codes = []
    for fmt in formats:
        code, out, err = run_cli(argv + list(fmt))
        assert code in allowed, (argv, fmt, code, err)
        assert "Traceback" not in err and "internal error" not in err, (fmt, err)
        if code == 2:
            assert len(err.strip().splitlines()) == 1, err
        if list(fmt) == ["--json"] and out:
            json.loads(out, parse_constant=lambda c: pytest.fail("non-strict JSON " + c))
        codes.append(code)
    return codes


@pytest.fixture
def node(tmp_path, monkeypatch):
    """The 8-GPU fake SGLang node (tests/fakenode.py), its NVML scenario in the environment; a module that needs
    another node (its own port, a driver library) defines its own ``node``."""
    from tests.fakenode import FakeNode, build_fake_nvml

    build_fake_nvml()
    with FakeNode(tmp_path / "node") as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        yield n


def run_json(argv: List[str]) -> Tuple[int, dict]:
    code, out, err = run_cli(argv + ["--json"])
    assert out, err
    return code, json.loads(out)


@pytest.fixture
def seed_json() -> dict:
    code, doc = run_json(["analyze", str(SEED_LOG), "--model-config", str(SEED_CONFIG)])
    assert code == 1  # warnings present, default --fail-on warning
    return doc["targets"][0]


@pytest.fixture(scope="session", autouse=True)
def _ssh_masters_of_this_run():
    """The OpenSSH transport's shared master connections (agent/remote/openssh.py) in a folder of this run's own,
    closed when the run ends: another copy of the suite never shares one, and none outlives the run."""
    import os
    import shutil
    import subprocess
    import tempfile

    if os.environ.get("KVFORENSICS_SSH_CONTROL_DIR"):
        yield
        return
    folder = tempfile.mkdtemp(prefix="kvf-cm-", dir="/tmp")
    os.chmod(folder, 0o700)
    os.environ["KVFORENSICS_SSH_CONTROL_DIR"] = folder
    try:
        yield
    finally:
        del os.environ["KVFORENSICS_SSH_CONTROL_DIR"]
        for name in os.listdir(folder):
            subprocess.run(["ssh", "-o", "ControlPath={}".format(os.path.join(folder, name)), "-O", "exit", "x"],
                           capture_output=True, timeout=10)
        # a master removes its own socket as it exits, maybe after this looks: what is gone is gone
        shutil.rmtree(folder, ignore_errors=True)
