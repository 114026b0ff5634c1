"""Reading logs: startups, windows from the end, .gz, stdin, and bad input."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys

import pytest

from kvforensics.collectors import logfile
from kvforensics.collectors.logfile import LogReadError, read_log
from tests import logbuilder as lb
from tests.conftest import ROOT, SEED_LOG, run_cli, run_json

ARGS = {"model_path": "/m", "mem_fraction_static": 0.85, "tp_size": 2, "page_size": 1, "speculative_algorithm": None}


def test_several_startups_last_is_default_and_startup_selects(tmp_path):
    log = tmp_path / "multi.log"
    lb.write(log, lb.startup(args=ARGS, tokens=100000), lb.noise(5),
             lb.startup(args=dict(ARGS, mem_fraction_static=0.9), tokens=150000), lb.noise(5),
             lb.startup(args=dict(ARGS, mem_fraction_static=0.8), tokens=120000))
    ex = read_log(str(log))
    assert (ex.index, ex.count, ex.index_from_end) == (3, 3, -1)
    assert ex.startup.events[0].kind == "server_args"
    assert read_log(str(log), 1).startup.events[0].data["args"]["mem_fraction_static"] == 0.85
    assert read_log(str(log), -2).startup.events[0].data["args"]["mem_fraction_static"] == 0.9
    code, doc = run_json(["analyze", str(log), "--startup", "2", "--fail-on", "never"])
    s = doc["targets"][0]["startup"]
    assert code == 0 and (s["index"], s["count"], s["max_total_num_tokens"]) == (2, 3, 150000)
    code, out, err = run_cli(["analyze", str(log), "--startup", "4"])
    assert code == 2 and "holds 3 startup(s)" in err and err.count("\n") == 1


def test_restart_without_server_args_splits_after_summary(tmp_path):
    log = tmp_path / "restart.log"
    lb.write(log, lb.startup(tokens=1000), lb.startup(tokens=2000))
    ex = read_log(str(log))
    assert ex.count == 2
    kv = [e for e in ex.startup.events if e.kind == "kv_pool"]
    assert {e.data["tokens"] for e in kv} == {2000}


def test_crash_during_load_then_restart(tmp_path):
    log = tmp_path / "crash.log"
    first = lb.startup(tokens=1000)[:6]  # dies while loading weights
    lb.write(log, first, lb.startup(tokens=3000))
    ex = read_log(str(log))
    assert ex.count == 2 and ex.startup.closed


def test_draft_load_is_not_a_restart(tmp_path):
    log = tmp_path / "draft.log"
    lb.write(log, lb.startup(tokens=5000, draft=True))
    ex = read_log(str(log))
    assert ex.count == 1
    assert sum(e.kind == "load_begin" for e in ex.startup.events) == 4  # 2 ranks x (target + draft)


def test_gzip_and_stdin(tmp_path):
    data = SEED_LOG.read_bytes()
    gz = tmp_path / "seed.log.gz"
    gz.write_bytes(gzip.compress(data))
    plain = read_log(str(SEED_LOG))
    packed = read_log(str(gz))
    assert [(e.kind, e.line, e.data) for e in packed.startup.events] == \
           [(e.kind, e.line, e.data) for e in plain.startup.events]
    code, out, err = run_cli(["analyze", "-", "--json", "--fail-on", "never"], stdin=data)
    assert code == 0 and '"target": "file:-"' in out and '"max_total_num_tokens": 159277' in out


def _small_windows(monkeypatch):
    monkeypatch.setattr(logfile, "WHOLE_FILE_BYTES", 64 << 10)
    monkeypatch.setattr(logfile, "FIRST_WINDOW_BYTES", 16 << 10)
    monkeypatch.setattr(logfile, "BLOCK_BYTES", 32 << 10)


def test_large_file_is_read_from_the_end(tmp_path, monkeypatch):
    _small_windows(monkeypatch)
    log = tmp_path / "big.log"
    lb.write(log, lb.startup(args=ARGS, tokens=1111), lb.noise(20000), lb.startup(args=ARGS, tokens=2222), lb.noise(50))
    size = log.stat().st_size
    ex = read_log(str(log))
    assert ex.window_start > size // 2  # the start of the file was never read
    assert ex.count is None and ex.index is None and ex.index_from_end == -1
    assert any("earlier ones were not counted" in n for n in ex.notes)
    kv = next(e for e in ex.startup.events if e.kind == "kv_pool")
    assert kv.data["tokens"] == 2222
    # line numbers are still exact (the prefix is counted when small)
    with open(log, encoding="utf-8") as f:
        assert "KV Cache is allocated" in f.readlines()[kv.line - 1]
    assert read_log(str(log), -2).startup.events[0].kind == "server_args"
    assert next(e for e in read_log(str(log), -2).startup.events if e.kind == "kv_pool").data["tokens"] == 1111


def test_startup_at_the_beginning_of_a_large_file(tmp_path, monkeypatch):
    _small_windows(monkeypatch)
    log = tmp_path / "early.log"
    lb.write(log, lb.startup(args=ARGS, tokens=4242), lb.noise(30000))
    ex = read_log(str(log))
    assert next(e for e in ex.startup.events if e.kind == "kv_pool").data["tokens"] == 4242
    assert ex.count == 1 and ex.index == 1


def test_line_numbers_unknown_beyond_the_counting_limit(tmp_path, monkeypatch):
    _small_windows(monkeypatch)
    monkeypatch.setattr(logfile, "LINE_COUNT_LIMIT_BYTES", 1024)
    log = tmp_path / "big.log"
    lb.write(log, lb.noise(20000), lb.startup(args=ARGS, tokens=77))
    ex = read_log(str(log))
    assert all(e.line is None for e in ex.startup.events)
    assert any("line numbers unknown" in n for n in ex.notes)
    code, doc = run_json(["analyze", str(log), "--fail-on", "never"])
    t = doc["targets"][0]
    assert any(p["code"] == "log.reader" and "line numbers unknown" in p["message"] for p in t["problems"])
    assert t["startup"]["ranks"][0]["sources"]["kv_tokens"].startswith("byte ")
    exact = read_log(str(log), count_lines=True)
    assert all(e.line is not None for e in exact.startup.events)


def test_fragment_is_analysed_for_what_it_holds(tmp_path):
    lines = lb.startup(args=ARGS)
    fragment = [x for x in lines if "KV Cache" in x or "Memory pool end" in x or "Capture" in x]
    log = tmp_path / "ticket.txt"
    lb.write(log, ["user: here is my log"], fragment)
    code, doc = run_json(["analyze", str(log), "--fail-on", "never"])
    t = doc["targets"][0]
    assert code == 0 and t["status"] == "partial"
    msg = next(p["message"] for p in t["problems"] if p["code"] == "log.fragment")
    assert "server_args line" in msg and "'Load weight begin'" in msg and "max_total_num_tokens" in msg
    assert t["startup"]["ranks"][0]["kv_tokens"] == 100000
    assert t["startup"]["ranks"][0]["pre_load_avail_bytes"] is None  # unknown, not 0


@pytest.mark.parametrize("content,expect", [
    (b"", "empty"),
    (b"\x00\x01\x02binary\x00" * 100, "not a text log"),
    (b"hello\nworld\n", "no startup lines of any engine found (looked for SGLang: 'Load weight'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, expect):
    p = tmp_path / "bad.log"
    p.write_bytes(content)
    code, out, err = run_cli(["analyze", str(p)])
    assert code == 2 and out == ""
    assert expect in err and err.count("\n") == 1 and "Traceback" not in err


def test_missing_file_and_directory(tmp_path):
    code, _, err = run_cli(["analyze", str(tmp_path / "nope.log")])
    assert code == 2 and "no such file" in err
    code, _, err = run_cli(["analyze", str(tmp_path)])
    assert code == 2 and "is a directory" in err


def test_unreadable_file():
    """A file the user may not read: one line naming the problem (collectors run on a bare python3)."""
    import shutil
    import tempfile

    system_python = "/usr/bin/python3"
    if not os.path.exists(system_python):
        pytest.skip("needs /usr/bin/python3 to run the reader as another user")
    folder = tempfile.mkdtemp(prefix="kvf-perm-")
    try:
        os.chmod(folder, 0o755)
        # a copy of the package, so the other user can import it wherever the checkout lives
        os.mkdir(os.path.join(folder, "kvforensics"))
        open(os.path.join(folder, "kvforensics", "__init__.py"), "w").close()
        shutil.copytree(str(ROOT / "collectors"), os.path.join(folder, "kvforensics", "collectors"))
        for dirpath, dirnames, filenames in os.walk(folder):
            for name in dirnames + filenames:
                os.chmod(os.path.join(dirpath, name), 0o755)
        path = os.path.join(folder, "secret.log")
        with open(path, "w") as f:
            f.write("[2026-01-01 10:00:00 TP0] Load weight begin. avail mem=1.00 GB\n")
        os.chmod(path, 0)
        kwargs = {}
        if os.geteuid() == 0:  # root reads anything: run the reader as an unprivileged user
            import pwd

            nobody = pwd.getpwnam("nobody")
            kwargs["preexec_fn"] = lambda: (os.setgid(nobody.pw_gid), os.setuid(nobody.pw_uid))
        code = ("import sys; sys.path.insert(0, sys.argv[2])\n"
                "from kvforensics.collectors.logfile import read_log, LogReadError\n"
                "try:\n read_log(sys.argv[1])\nexcept LogReadError as e:\n print(e.code); print(e.message)")
        proc = subprocess.run([system_python, "-I", "-c", code, path, folder], capture_output=True, text=True,
                              timeout=60, **kwargs)
        assert proc.stdout.splitlines() == ["unreadable",
                                            path + ": permission denied (run as a user who can read it)"], proc.stderr
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_json_error_document_for_bad_input(tmp_path):
    code, out, err = run_cli(["analyze", str(tmp_path / "nope.log"), "--json"])
    assert code == 2
    import json

    doc = json.loads(out)
    assert doc["schema"] == "kvforensics.report/1"
    assert doc["targets"][0]["status"] == "error"
    assert doc["targets"][0]["problems"][0]["code"] == "log.missing"


def test_read_log_rejects_startup_zero():
    with pytest.raises(LogReadError):
        read_log(str(SEED_LOG), 0)


# --- hostile and unusual inputs ----------------------------------------------------------


def test_a_pipe_is_streamed_not_called_empty(tmp_path):


    done = subprocess.run(["bash", "-c", "{} -m kvforensics analyze <(cat {}) --json".format(sys.executable, SEED_LOG)],
                          capture_output=True, text=True, cwd=str(ROOT), timeout=120)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["targets"][0]["startup"]["max_total_num_tokens"] == 159277


def test_a_fifo_without_writer_is_an_error_not_a_hang(tmp_path, monkeypatch):
    from kvforensics.collectors import logfile

    monkeypatch.setattr(logfile, "FIFO_WAIT_S", 0.2)
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    with pytest.raises(logfile.LogReadError) as exc:
        logfile.read_log(str(fifo))
    assert "nothing wrote to this pipe" in exc.value.message


def test_a_truncated_gz_keeps_the_startups_before_the_cut(tmp_path):


    from kvforensics.collectors import logfile

    text = SEED_LOG.read_bytes()
    blob = gzip.compress(text * 3)
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(blob[:-40])  # the end of the last copy is lost, the copies before it are whole
    excerpt = logfile.read_log(str(cut), startup=1)
    assert excerpt.count >= 2 and any("ends early" in n for n in excerpt.notes)


def test_a_symlink_loop_is_named(tmp_path):
    from kvforensics.collectors import logfile

    a, b = tmp_path / "a", tmp_path / "b"
    os.symlink(str(b), str(a))
    os.symlink(str(a), str(b))
    with pytest.raises(logfile.LogReadError) as exc:
        logfile.read_log(str(a))
    assert "symbolic link" in exc.value.message


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le"])
def test_utf16_logs_are_decoded(tmp_path, encoding):
    from kvforensics.collectors import logfile

    path = tmp_path / "win.log"
    path.write_bytes(SEED_LOG.read_text(encoding="utf-8").encode(encoding))
    excerpt = logfile.read_log(str(path))
    assert any(e.kind == "summary" and e.data["max_total_num_tokens"] == 159277 for e in excerpt.startup.events)


def test_memory_stays_flat_for_many_startups(tmp_path):
    """Streamed input (here gzip) with 20,000 startups: only the chosen one is kept, whatever
    --startup asks (the others are counted)."""
    one = ("[2025-06-24 10:00:00] server_args=ServerArgs(model_path='/m', mem_fraction_static=0.8)\n"
           "[2025-06-24 10:00:00 TP0] Load weight begin. avail mem=78.00 GB\n"
           "[2025-06-24 10:00:00 TP0] Load weight end. type=L, dtype=x, avail mem=48.00 GB, mem usage=30.00 GB.\n"
           "[2025-06-24 10:00:00 TP0] KV Cache is allocated. #tokens: 100, K size: 0.01 GB, V size: 0.01 GB\n")
    path = tmp_path / "loop.log.gz"
    with gzip.open(str(path), "wt") as f:
        for _ in range(20000):
            f.write(one)
    # VmHWM: the child's own peak since exec (ru_maxrss also counts the test runner's pages it was forked from)
    code = ("import sys; sys.argv = ['kvforensics', 'analyze', {!r}, '--startup', '1', '--json'];"
            "from kvforensics.agent.cli import main; rc = main(sys.argv[1:]);"
            "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1];"
            "sys.stderr.write('RSS %s\\\\n' % hwm)").format(str(path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=300)
    rss_kb = int(re.findall(r"RSS (\d+)", done.stderr)[-1])
    assert json.loads(done.stdout)["targets"][0]["startup"]["count"] == 20000
    assert rss_kb < 150 * 1024, rss_kb  # the same ballpark as analysing one startup
