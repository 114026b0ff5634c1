"""Startup facts survive log rotation and restarts: the startup an engine run's log held is kept in the
history and used while the log no longer holds it (logrotate's copytruncate, a rename), by record, by a
restarted serve and by inspect on the node; a log the engine writes where kvforensics cannot see it by path
(systemd's PrivateTmp=, another mount namespace) is read through the engine's own /proc/PID/fd/1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from tests.conftest import run_cli
from tests.fakenode import FAKE_LIB, FakeNode, build_fake_nvml


def _series(text: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _value(series, name: str, **labels: str):
    return next((v for (n, ls), v in series.items() if n == name and all(dict(ls).get(k) == x
                                                                           for k, x in labels.items())), None)


def _record(db: Path, prom: Path) -> Tuple[int, str, str]:
    return run_cli(["record", "--db", str(db), "--nvml-lib", str(FAKE_LIB), "--no-http", "--prom-file", str(prom)])


def _copytruncate(log: Path) -> None:
    """What logrotate's copytruncate does: copy the file aside, truncate it in place (the engine keeps its
    descriptor); then the engine goes on writing serving lines."""
    shutil.copy(str(log), str(log) + ".1")
    with open(str(log), "r+b") as f:
        f.truncate(0)
    with open(str(log), "a") as f:
        f.write("[2026-12-01 10:00:00] Decode batch. #running-req: 3, #token: 4096, token usage: 0.03\n" * 50)


def test_after_copytruncate_the_kept_startup_keeps_the_engines_series(node, tmp_path):
    db, prom = tmp_path / "h.db", tmp_path / "kvforensics.prom"
    assert _record(db, prom)[0] == 0
    before = _series(prom.read_text())
    tokens = _value(before, "kvforensics_engine_kv_pool_tokens", engine="sglang-1")
    assert tokens == 159277
    _copytruncate(node.log)
    code, out, err = _record(db, prom)
    assert code == 0, err
    after = _series(prom.read_text())
    assert _value(after, "kvforensics_engine_kv_pool_tokens", engine="sglang-1") == tokens
    assert _value(after, "kvforensics_engine_unused_bytes", engine="sglang-1") is not None
    assert _value(after, "kvforensics_collector_success", collector="engine_log", engine="sglang-1") == 1
    assert _value(after, "kvforensics_findings", code="engine_log_missing") is None
    kv = {ls: v for (n, ls), v in before.items() if n == "kvforensics_engine_kv_pool_bytes"}
    assert kv and all(after[("kvforensics_engine_kv_pool_bytes", ls)] == v for ls, v in kv.items())
    # inspect on the node says where the startup came from
    code, out, err = run_cli(["inspect", "--json", "--no-http", "--nvml-lib", str(FAKE_LIB), "--db", str(db)])
    t = json.loads(out)["targets"][0]
    notes = [p["message"] for p in t["problems"] if p["code"] == "engine_log.reader"]
    assert any("the log no longer holds this engine run's startup" in n and "kept in the history" in n
               for n in notes), notes
    assert "engine_log_missing" not in {f["code"] for f in t["findings"]}
    # without the history, the truth: the log holds no startup
    code, out, err = run_cli(["inspect", "--json", "--no-http", "--nvml-lib", str(FAKE_LIB), "--db",
                              str(tmp_path / "none.db")])
    assert "engine_log_missing" in {f["code"] for f in json.loads(out)["targets"][0]["findings"]}


def test_a_serve_started_after_the_rotation_uses_the_kept_startup(node, tmp_path):
    """serve restarted (a new pod, a new image) after the log was rotated: the history still has the run's startup."""

    from tests.test_serve import start_serve

    db = tmp_path / "h.db"
    assert _record(db, tmp_path / "k.prom")[0] == 0
    _copytruncate(node.log)
    served = start_serve(node.env(), "--db", str(db), "--nvml-lib", str(FAKE_LIB), "--no-http")
    try:
        status, text = served.get("/metrics")
    finally:
        served.stop()
    assert status == 200, text
    assert _value(_series(text), "kvforensics_engine_kv_pool_tokens", engine="sglang-1") == 159277


def test_a_new_run_does_not_borrow_the_old_runs_startup(tmp_path, monkeypatch):
    """A restart whose log holds no startup (yet) is a new run: nothing of the old run's startup is used."""
    build_fake_nvml()
    db, prom = tmp_path / "h.db", tmp_path / "k.prom"
    with FakeNode(tmp_path / "a") as first:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(first.scenario))
        assert _record(db, prom)[0] == 0
    with FakeNode(tmp_path / "b", log_text="") as second:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(second.scenario))
        assert _record(db, prom)[0] == 0
    series = _series(prom.read_text())
    assert _value(series, "kvforensics_engine_kv_pool_tokens", engine="sglang-1") is None
    assert _value(series, "kvforensics_findings", code="engine_log_missing", engine="sglang-1") == 1


def test_a_startup_kept_in_the_history_is_checked_when_read(node, tmp_path):
    """A kept startup that is not a snapshot's engine_log section was not written by kvforensics: corrupt."""
    import sqlite3

    db, prom = tmp_path / "h.db", tmp_path / "k.prom"
    assert _record(db, prom)[0] == 0
    conn = sqlite3.connect(str(db))
    with conn:
        conn.execute("""UPDATE startups SET section = '{"lines": [[1, 0, 5]]}'""")
    conn.close()
    _copytruncate(node.log)
    code, out, err = _record(db, prom)
    assert code == 0 and "was not usable and was moved aside" in err and "startups.section" in err, err


class PrivateTmpNode(FakeNode):
    """The fake SGLang server in a mount namespace of its own, writing its log into a tmpfs there
    (``<dir>/tmp``, a private /tmp): from here that path is an empty folder, or holds another file."""

    def spawn(self, argv: List[str], out: Any, env: Dict[str, str],
              pass_fds: Tuple[int, ...] = ()) -> subprocess.Popen:
        private = self.dir / "tmp"
        private.mkdir(exist_ok=True)
        script = ('mount -t tmpfs none "$PRIV" || exit 99; cat "$SEED" > "$PRIV/server.log"; '
                  'exec "$@" >> "$PRIV/server.log" 2>&1')
        return subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"] + argv,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(self.dir),
                                env=dict(env, PRIV=str(private), SEED=str(self.log)), start_new_session=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare for a private mount namespace")
@pytest.mark.parametrize("decoy", [False, True])
def test_a_log_behind_a_private_tmp_is_read_through_the_engines_descriptor(tmp_path, monkeypatch, decoy):
    build_fake_nvml()
    node = PrivateTmpNode(tmp_path / "node")
    try:
        node.start()
    except RuntimeError:
        pytest.skip("cannot mount a tmpfs in a private mount namespace here")
    try:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(node.scenario))
        path = node.dir / "tmp" / "server.log"
        assert os.readlink("/proc/{}/fd/1".format(node.server_pid)) == str(path) and not path.exists()
        if decoy:  # another file at the same path here: not the engine's
            path.write_text("not the engine's log\n")
        code, out, err = run_cli(["inspect", "--json", "--no-http", "--nvml-lib", str(FAKE_LIB), "--db",
                                  str(tmp_path / "none.db")])
    finally:
        node.stop()
    t = json.loads(out)["targets"][0]
    assert t["startup"] is not None and t["startup"]["max_total_num_tokens"] == 159277, t["problems"]
    assert "engine_log_missing" not in {f["code"] for f in t["findings"]}
