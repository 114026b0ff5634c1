"""What `kvforensics analyze LOG --json` may import: a command pays only for what it uses.

Measured with ``python -X importtime`` (bench/RESULTS.md, 2026-12-01): typer's pydantic adapters
(pydantic, pydantic_core, annotated_types: ~50–80 ms) coerce option values we can coerce with the
stdlib; rich (~30 ms) draws help and tracebacks nobody sees in JSON; jsonschema (~40 ms with its
referencing/rpds stack) checks documents analyze does not read; paramiko/cryptography (SSH),
prometheus_client, sqlite3 (history) and the other commands' modules belong to inspect, record and
serve. No timing here (timings live in bench/): the list is what must not load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HEAVY = (
    "pydantic", "pydantic_core", "annotated_types", "typer._adapters",  # typer's coercion
    "rich",  # help and tracebacks
    "jsonschema", "referencing", "rpds",  # schema checks
    "paramiko", "cryptography",  # SSH
    "prometheus_client", "sqlite3",  # record, serve, history
    "agent.cli.inspect", "agent.cli.record", "agent.cli.serve", "agent.cli.watch", "agent.cli.history",
    "agent.cli.deploy", "agent.cli.probe", "agent.remote",
    "reports.terminal", "reports.markdown", "reports.oneline",  # other formats' renderers
)

_PROBE = """
import json, sys
from agent.cli import main
rc = main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
"""


def _modules(*args: str) -> set:
    proc = subprocess.run([sys.executable, "-c", _PROBE] + list(args), cwd=str(ROOT), capture_output=True,
                          text=True, timeout=120)
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line[len("MODULES "):])), proc.stdout


def _heavy(modules: set) -> list:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_analyze_json_imports_nothing_heavy():
    modules, out = _modules("analyze", str(ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log"), "--json")
    assert json.loads(out)["schema"]  # it did its job
    assert _heavy(modules) == []


def test_the_guard_sees_what_it_guards():
    """The same probe on the terminal format does load a renderer: the list is not vacuous."""
    modules, _ = _modules("analyze", str(ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log"))
    assert "reports.terminal" in _heavy(modules)


def test_what_record_types_unchecked_conforms(tmp_path, monkeypatch):
    """record and serve type their own collectors' snapshots without the schema check (per-run work that
    finds nothing: evidence.Collected); here the check runs on exactly what they collect."""
    from agent.cli.record import collector
    from agent.model import evidence
    from tests.fakenode import FAKE_LIB, FakeNode, build_fake_nvml

    build_fake_nvml()
    with FakeNode(tmp_path / "node") as node:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(node.scenario))
        snaps = collector(str(FAKE_LIB), None, None, False, None)()  # one per engine on the node
    assert snaps and all(type(snap) is evidence.Collected for snap in snaps)
    for snap in snaps:
        assert snap["nvml"]["gpus"]
        evidence.check("snapshot", dict(snap))
        assert evidence.parse(snap).nvml.gpus == evidence.parse(dict(snap)).nvml.gpus
