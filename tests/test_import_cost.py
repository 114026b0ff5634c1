"""What `kvforensics analyze LOG --json` may import: a command pays only for what it uses.

Measured with ``python -X importtime`` (bench/RESULTS.md, 2026-12-01): typer (~25 ms, with the click it
vendors) reads every command line and is not listed; its pydantic adapters (pydantic, pydantic_core,
annotated_types: ~50–80 ms) coerce option values we can coerce with the stdlib; rich (~30 ms) draws
help and tracebacks nobody sees in JSON; jsonschema (~40 ms with its referencing/rpds stack) checks
documents analyze does not read; paramiko/cryptography (SSH), prometheus_client, sqlite3 (history) and
the other commands' modules belong to inspect, record and serve. No timing here (timings live in
bench/): the list is what must not load. `record` and local `inspect --json` on the 8-GPU fake node
have their own lists (issue 21), drawn from the same one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

HEAVY = (
    "click",  # typer 0.2x vendors its own (typer._click): a second click would be a second parser
    "pydantic", "pydantic_core", "annotated_types",  # typer's coercion
    "rich",  # help and tracebacks
    "jsonschema", "referencing", "rpds",  # schema checks
    "paramiko", "cryptography",  # SSH
    "prometheus_client", "sqlite3",  # record, serve, history
    "kvforensics.agent.cli.inspect", "kvforensics.agent.cli.record", "kvforensics.agent.cli.serve",
    "kvforensics.agent.cli.watch", "kvforensics.agent.cli.history",
    "kvforensics.agent.cli.deploy", "kvforensics.agent.cli.probe", "kvforensics.agent.remote",
    "kvforensics.reports.terminal", "kvforensics.reports.markdown", "kvforensics.reports.oneline",
    # other formats' renderers
)

_PROBE = """
import json, sys
from kvforensics.agent.cli import main
rc = main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
"""


# A command run in a PID namespace of its own (and /proc mounted for it) sees no process of this machine: other
# tests' fake engines, or another copy of the suite's, cannot change what it finds and so what it imports.
ALONE = ["unshare", "--pid", "--fork", "--mount", "--mount-proc"]
needs_own_pids = pytest.mark.skipif(not shutil.which("unshare") or os.geteuid() != 0,
                                    reason="needs root for a PID namespace")


def _modules(*args: str, env=None, alone: bool = False) -> set:
    """The modules a command imported, and its stdout; ``alone``: in a PID namespace of its own (ALONE)."""
    proc = subprocess.run((ALONE if alone else []) + [sys.executable, "-c", _PROBE] + list(args), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=120, env=env)
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line[len("MODULES "):])), proc.stdout


def _heavy(modules: set, heavy=HEAVY) -> list:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy))


# `record` from cron (bench/bench_record.py, 2026-12-01): sqlite3 (the history) and prometheus_client (the
# textfile) are its job; it checks a startup its history keeps only when its log no longer holds one, so a run
# whose log does costs no jsonschema; nothing of SSH, kubectl or rendering.
RECORD_HEAVY = tuple(h for h in HEAVY if h not in ("sqlite3", "prometheus_client", "kvforensics.agent.cli.record")) + (
    "kvforensics.collectors.selection",)  # --engine's parser: a record of every engine has nothing to parse
# Local `inspect --json`: sqlite3 reads the history record keeps; remote targets' modules only with remote targets
# (agent.remote.targets, which names them, is light), a renderer only for its format.
INSPECT_HEAVY = tuple(h for h in HEAVY if h not in ("sqlite3", "kvforensics.agent.cli.inspect",
                                                    "kvforensics.agent.remote")) + (
    "kvforensics.agent.remote.fleet", "kvforensics.agent.remote.ssh", "kvforensics.agent.remote.kubectl",
    "kvforensics.agent.remote.probe", "kvforensics.agent.remote.bundles",
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


@needs_own_pids
def test_a_node_without_an_engine_imports_no_engine_analysis(tmp_path):
    """record from cron on an idle GPU node, or a sweep of nodes that run none: no engine's analysis, rules or
    recommenders (~25 ms). In a PID namespace of its own, so other tests' fake engines are not on this node."""
    env = dict(os.environ, KVFORENSICS_DB=str(tmp_path / "none.db"))
    modules, out = _modules("inspect", "--json", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "--no-http",
                            "--fail-on", "never", env=env, alone=True)
    codes = [f["code"] for f in json.loads(out)["targets"][0]["findings"]]
    assert "engine_not_found" in codes  # the rule that names every engine still ran
    assert _heavy(modules, ("kvforensics.agent.sglang.analysis", "kvforensics.agent.sglang.rules",
                            "kvforensics.agent.sglang.recommend",
                            "kvforensics.agent.vllm.analysis", "kvforensics.agent.vllm.rules",
                            "kvforensics.agent.vllm.recommend")) == []


def test_analyze_json_imports_nothing_heavy():
    modules, out = _modules("analyze", str(ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log"), "--json")
    assert json.loads(out)["schema"]  # it did its job
    assert _heavy(modules) == []


def test_the_guard_sees_what_it_guards():
    """The same probe on the terminal format does load a renderer: the list is not vacuous."""
    modules, _ = _modules("analyze", str(ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log"))
    assert "kvforensics.reports.terminal" in _heavy(modules)


def test_what_record_types_unchecked_conforms(tmp_path, monkeypatch):
    """record and serve type their own collectors' snapshots without the schema check (per-run work that
    finds nothing: evidence.Collected); here the check runs on exactly what they collect."""
    from kvforensics.agent.cli.record import collector
    from kvforensics.agent.model import evidence
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


_SCAN = """
import json, sys
from kvforensics.collectors import engines
from kvforensics.collectors.plugin import ENGINES
hits = [engines.classify(argv) for argv in ({argvs})]
loaded = sorted(m for m in sys.modules if m.startswith("kvforensics.collectors."))
{after}
print(json.dumps({{"hits": [h and h[0] for h in hits], "loaded": loaded,
                  "later": sorted(m for m in sys.modules if m.startswith("kvforensics.collectors."))}}))
"""
_LOG_PARTS = ("formats", "log", "startups", "http", "metrics", "server_args")


def _scan(argvs: str, after: str = "") -> dict:
    proc = subprocess.run([sys.executable, "-c", _SCAN.format(argvs=argvs, after=after)], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_process_scan_imports_no_engine_log_parser():
    """The probe classifies every process of every host with every engine's descriptor, but reads a log
    only for an engine it found: the descriptors import their command-line rules alone, the log formats
    (dozens of regexes, compiled from source on each host) on first use."""
    got = _scan('["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "m"], ["vllm", "serve", "m"], '
                '["bash"]', after='ENGINES.get("vllm").parse_line("INFO x", 1, 0); list(ENGINES.get("vllm").formats)')
    assert got["hits"] == ["sglang", "vllm", None]  # the rules still apply
    engines_loaded = [m for m in got["loaded"] if m.split(".")[2] in ("sglang", "vllm")]
    assert sorted(engines_loaded) == ["kvforensics.collectors.sglang", "kvforensics.collectors.sglang.plugin",
                                      "kvforensics.collectors.sglang.processes",
                                      "kvforensics.collectors.vllm", "kvforensics.collectors.vllm.plugin",
                                      "kvforensics.collectors.vllm.processes"]
    # first use imports what it needs, that engine's only: the guard sees what it guards
    assert {"kvforensics.collectors.vllm.log", "kvforensics.collectors.vllm.formats"} <= set(got["later"])
    assert not [m for m in got["later"]
                if m.startswith("kvforensics.collectors.sglang.") and m.split(".")[3] in _LOG_PARTS]


def test_lazy_rows_read_as_the_tuple_they_name():
    from kvforensics.collectors.plugin import ENGINES
    from kvforensics.collectors.registry import lazy_rows
    from kvforensics.collectors.sglang import formats as sglang_formats
    from kvforensics.collectors.vllm import formats as vllm_formats

    assert tuple(ENGINES.get("sglang").formats) == sglang_formats.FORMATS
    vllm = ENGINES.get("vllm")
    assert tuple(vllm.formats) == tuple(r for r in vllm_formats.FORMATS if r.needle not in vllm_formats.IDLE_NEEDLES)
    assert tuple(vllm.idle_needles) == vllm_formats.IDLE_NEEDLES and len(vllm.idle_needles) == 1
    rows = lazy_rows("kvforensics.collectors.vllm.formats:IDLE_NEEDLES")
    assert rows[0] == vllm_formats.IDLE_NEEDLES[0] and "lazy_rows" in repr(rows)


# The probe on a host with no engine and no driver library, what every inspected host pays (agent/remote/probe.py,
# 2026-12-01): its sources arrive as JSON, not a zip (zipfile pulled in shutil, pathlib, urllib and threading,
# ~6 ms); the hostname and Python version come from os.uname and sys.version (socket and platform, ~3 ms); pynvml
# (and the subprocess and tempfile of its ctypes.util) only where a driver library loads. An engine's log and
# HTTP readers bring their own.
PROBE_HEAVY = ("zipfile", "shutil", "pathlib", "urllib", "socket", "platform", "email", "http", "ssl", "pynvml",
               "subprocess", "tempfile", "kvforensics.collectors.selection",
               # an idle host's probe: no frozen dataclasses (with inspect, ast and dis, ~12 ms of its CPU), no pods
               "dataclasses", "inspect", "kvforensics.collectors.pods")


@needs_own_pids
def test_the_probe_imports_nothing_heavy_on_the_host():
    from kvforensics.agent.remote import probe

    script = probe.build({"nvml_lib": "/nonexistent/libnvidia-ml.so.1", "log": None, "http": False}).script
    # In a PID namespace of its own the probe finds no engine (other tests' fake servers run on this machine);
    # -S: what site imports (this venv's editable-install finder loads pathlib and urllib) is not the probe's.
    done = subprocess.run(ALONE + [sys.executable, "-I", "-S", "-X", "importtime", "-"], input=script,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    modules = {line.rsplit("|", 1)[1].strip() for line in done.stderr.decode().splitlines()
               if line.startswith("import time:") and "|" in line}
    assert "kvforensics.collectors.snapshot" in modules  # the guard sees the probe's own imports
    assert _heavy(modules, PROBE_HEAVY) == []


_BEFORE_SSH = """
import json, sys
at_start = set(sys.modules)  # the interpreter's, and site's (this tree's editable finder imports pathlib)
seen = []
def hook(event, args):
    if event == "subprocess.Popen" and "-G" in list(args[1]) and not seen:
        seen.append(sorted(set(sys.modules) - at_start))
sys.addaudithook(hook)
from kvforensics.agent.cli import main
main(sys.argv[1:])
sys.stderr.write("\\nMODULES " + json.dumps(seen[0] if seen else None) + "\\n")
"""
# What one host's inspect does before its ssh starts is all on the on-call engineer's clock (bench/bench_fleet.py,
# 2026-12-03); the command line (typer: ~55 ms), the schema check, the model and the report are imported while the
# handshake runs (agent/cli/headstart.py), and so are shutil (~7 ms: bz2, lzma) and pathlib (~10 ms).
BEFORE_SSH_HEAVY = ("jsonschema", "referencing", "paramiko", "rich", "hashlib", "concurrent.futures", "logging",
                    "tempfile", "kvforensics.agent.model.evidence", "kvforensics.agent.model.reconcile",
                    "kvforensics.reports", "typer", "click", "shutil", "pathlib", "lzma", "kvforensics.agent.model",
                    "kvforensics.agent.remote.fleet", "kvforensics.agent.remote.probe")


@pytest.mark.skipif(not shutil.which("ssh"), reason="no OpenSSH client")
def test_one_hosts_inspect_imports_only_what_starting_its_ssh_needs(tmp_path):
    cfg = tmp_path / "ssh_config"  # a host on a closed port: ssh -G resolves it, and ssh fails at once
    cfg.write_text("Host node\n  HostName 127.0.0.1\n  Port 1\n  BatchMode yes\n")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    for _ in range(2):  # the second run, as every run after a first: the packed probe read from the user's cache
        proc = subprocess.run([sys.executable, "-c", _BEFORE_SSH, "inspect", "--ssh-config", str(cfg), "--json",
                               "--no-http", "--transport", "openssh", "--no-multiplex", "node"], cwd=str(ROOT),
                              capture_output=True, text=True, timeout=120, env=env)
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    modules = json.loads(line[len("MODULES "):])
    assert modules and "kvforensics.agent.remote.openssh" in modules  # the guard saw ssh -G start
    assert _heavy(set(modules), BEFORE_SSH_HEAVY) == []
