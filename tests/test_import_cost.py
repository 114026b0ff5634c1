"""What `kvforensics analyze LOG --json` may import: a command pays only for what it uses.

Measured with ``python -X importtime`` (bench/RESULTS.md, 2026-12-01): typer's pydantic adapters
(pydantic, pydantic_core, annotated_types: ~50–80 ms) coerce option values we can coerce with the
stdlib; rich (~30 ms) draws help and tracebacks nobody sees in JSON; jsonschema (~40 ms with its
referencing/rpds stack) checks documents analyze does not read; paramiko/cryptography (SSH),
prometheus_client, sqlite3 (history) and the other commands' modules belong to inspect, record and
serve. No timing here (timings live in bench/): the list is what must not load. `record` and local
`inspect --json` on the 8-GPU fake node have their own lists (issue 21), drawn from the same one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def _modules(*args: str, env=None) -> set:
    proc = subprocess.run([sys.executable, "-c", _PROBE] + list(args), cwd=str(ROOT), capture_output=True,
                          text=True, timeout=120, env=env)
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line[len("MODULES "):])), proc.stdout


def _heavy(modules: set, heavy=HEAVY) -> list:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy))


# `record` from cron (bench/bench_record.py, 2026-12-01): sqlite3 (the history) and prometheus_client (the
# textfile) are its job; it checks a startup its history keeps only when its log no longer holds one, so a run
# whose log does costs no jsonschema; nothing of SSH, kubectl or rendering.
RECORD_HEAVY = tuple(h for h in HEAVY if h not in ("sqlite3", "prometheus_client", "agent.cli.record"))
# Local `inspect --json`: sqlite3 reads the history record keeps; remote targets' modules only with remote targets
# (agent.remote.targets, which names them, is light), a renderer only for its format.
INSPECT_HEAVY = tuple(h for h in HEAVY if h not in ("sqlite3", "agent.cli.inspect", "agent.remote")) + (
    "agent.remote.fleet", "agent.remote.ssh", "agent.remote.kubectl", "agent.remote.probe", "agent.remote.bundles",
    "concurrent.futures")


@pytest.fixture(scope="module")
def fake_node(tmp_path_factory):
    from tests.fakenode import FAKE_LIB, FakeNode, build_fake_nvml

    build_fake_nvml()
    with FakeNode(tmp_path_factory.mktemp("import-cost-node")) as node:
        yield node, str(FAKE_LIB)


def test_record_imports_nothing_heavy(fake_node, tmp_path):
    node, lib = fake_node
    prom = tmp_path / "k.prom"
    for _ in range(2):  # the second run finds the history (and the startup) the first one kept
        modules, _ = _modules("record", "--db", str(tmp_path / "h.db"), "--prom-file", str(prom), "--nvml-lib", lib,
                              "--no-http", "--quiet", env=node.env())
        assert "kvforensics_gpu_memory_free_bytes{" in prom.read_text()  # it did its job
        assert _heavy(modules, RECORD_HEAVY) == []


def test_local_inspect_json_imports_nothing_heavy(fake_node, tmp_path):
    node, lib = fake_node
    env = dict(node.env(), KVFORENSICS_DB=str(tmp_path / "none.db"))
    modules, out = _modules("inspect", "--json", "--nvml-lib", lib, "--no-http", "--fail-on", "never", env=env)
    assert json.loads(out)["targets"][0]["status"] == "ok"
    assert _heavy(modules, INSPECT_HEAVY) == []


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
