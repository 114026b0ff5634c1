"""Before/after of "pay only for what a command uses": this tree against a base revision, side by side.

The base is ``git archive KVF_BENCH_BASE_REV`` (default ``main``) unpacked in a temporary folder (or the
folder KVF_BENCH_BASE names), run by the same interpreter from its own folder (its ``agent``,
``collectors``, ``reports`` come first on sys.path). Runs alternate base/this, so both see the same
load; medians of KVF_BENCH_RUNS (default 9; 3 for the fleet). Measured:

* ``analyze LOG --json`` on the small seed log (examples/, 1 startup): wall and CPU time;
* one ``record`` on the 8-GPU fake node (tests/fakenode.py): CPU time (user + sys) and peak RSS, and the CPU per
  sample of the shipped configuration (6 samples per run), and ``serve``'s CPU per sample (the resident collector);
* the probe's bytes on the wire (what one SSH exec sends), and its CPU on the 8-GPU fake node;
* the fleet: 32 loopback hosts, 16 at a time (tests/sshd.py), against ``xargs -P 16 ssh HOST python3 -c pass``.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import append  # noqa: E402

RUNS = int(os.environ.get("KVF_BENCH_RUNS", "9"))
FLEET_RUNS = int(os.environ.get("KVF_BENCH_FLEET_RUNS", "3"))
HOSTS, PARALLEL = int(os.environ.get("KVF_BENCH_HOSTS", "32")), 16
LOG = ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log"
# The system's interpreter, as an inspected host runs it: a version manager's `python3` shim on PATH costs more
# CPU than the probe itself.
HOST_PYTHON = os.environ.get("KVF_BENCH_HOST_PYTHON") or ("/usr/bin/python3" if os.path.exists("/usr/bin/python3")
                                                          else "python3")


def base_tree() -> Tuple[Path, str]:
    given = os.environ.get("KVF_BENCH_BASE")
    rev = os.environ.get("KVF_BENCH_BASE_REV", "main")
    if given:
        return Path(given), os.environ.get("KVF_BENCH_BASE_REV", given)
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=str(ROOT), capture_output=True, text=True,
                         check=True).stdout.strip()
    out = Path(tempfile.mkdtemp(prefix="kvf-bench-base-"))
    blob = subprocess.run(["git", "archive", "--format=tar", sha], cwd=str(ROOT), capture_output=True,
                          check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
        tf.extractall(str(out))
    return out, "{} ({})".format(rev, sha)


def _measure(cmd: Sequence[str], cwd: Path, env: Dict[str, str], ok=(0, 1)) -> Tuple[float, float, int]:
    """(wall s, CPU s, peak RSS bytes) of one run."""
    start = time.perf_counter()
    proc = subprocess.Popen(list(cmd), cwd=str(cwd), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    assert code in ok, (cmd, code, proc.stderr.read()[-2000:])
    proc.stderr.close()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def _side_by_side(trees: List[Path], cmd: Sequence[str], env: Dict[str, str], runs: int) -> List[List[Tuple]]:
    results: List[List[Tuple]] = [[] for _ in trees]
    for _ in range(runs):
        for i, tree in enumerate(trees):
            results[i].append(_measure(cmd, tree, env))
    return results


def _med(rows: List[Tuple], k: int) -> float:
    return statistics.median(r[k] for r in rows)


def analyze(trees: List[Path]) -> List[Tuple[float, float]]:
    """Each tree's (wall, CPU) medians, then the bare interpreter's, run in the same alternation (the peer)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="")
    for tree in trees:  # warm the bytecode caches and the page cache
        _measure([sys.executable, "-m", "kvforensics", "analyze", str(LOG), "--json"], tree, env)
    res: List[List[Tuple]] = [[] for _ in trees] + [[]]
    for _ in range(RUNS):
        for i, tree in enumerate(trees):
            res[i].append(_measure([sys.executable, "-m", "kvforensics", "analyze", str(LOG), "--json"], tree, env))
        res[-1].append(_measure([sys.executable, "-c", "pass"], ROOT, env))
    return [(_med(r, 0), _med(r, 1)) for r in res]


@contextlib.contextmanager
def _fake_node(prefix: str) -> Iterator[Tuple[Path, Path, Dict[str, str]]]:
    """The 8-GPU fake node running (tests/fakenode.py): a scratch folder, the fake driver library, and the
    environment a command needs to see the node (without this tree's PYTHONPATH: each tree imports its own)."""
    from tests.fakenode import FakeNode, build_fake_nvml

    lib = build_fake_nvml()
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with FakeNode(work / "node") as node:
            env = dict(node.env())
            env.pop("PYTHONPATH", None)
            yield work, lib, env
    finally:
        shutil.rmtree(str(work), ignore_errors=True)


def record(trees: List[Path]) -> List[Tuple[float, float, float]]:
    """Per tree: CPU of a one-sample run, its peak RSS, and CPU per sample of the shipped configuration
    (deploy/: 6 samples per run; --interval 0 here, which changes the wall time, not the CPU)."""
    out = []
    with _fake_node("kvf-bench-perf-") as (work, lib, env):
        res: List[List[Tuple]] = [[] for _ in trees]
        six: List[List[Tuple]] = [[] for _ in trees]
        for _ in range(RUNS + 1):
            for i, tree in enumerate(trees):
                cmd = [sys.executable, "-m", "kvforensics", "record", "--db", str(work / "h{}.db".format(i)),
                       "--prom-file",
                       str(work / "k{}.prom".format(i)), "--nvml-lib", str(lib), "--no-http", "--quiet"]
                res[i].append(_measure(cmd, tree, env, ok=(0,)))
                six[i].append(_measure(cmd + ["--samples", "6", "--interval", "0"], tree, env, ok=(0,)))
        for r, s in zip(res, six):
            r = r[1:]  # the first run creates the history
            out.append((_med(r, 1), max(x[2] for x in r), _med(s[1:], 1) / 6))
    return out


def probe_cpu(trees: List[Path]) -> Tuple[List[float], float]:
    """CPU of one probe run on the 8-GPU fake node (``python3 -I -``, as over SSH), per tree, and of
    ``python3 -I -`` given ``pass``: what each inspected host spends."""
    from tests.fakenode import build_fake_nvml

    lib = build_fake_nvml()
    code = ("import sys; from kvforensics.agent.remote import probe; "
            "sys.stdout.buffer.write(probe.build({{'nvml_lib': {!r}, 'log': None, 'startup': -1, "
            "'model_config_path': None, 'http': False}}).script)").format(str(lib))
    scripts = [subprocess.run([sys.executable, "-c", code], cwd=str(t), capture_output=True, check=True).stdout
               for t in trees]

    def cpu(script: bytes, env: Dict[str, str]) -> float:
        proc = subprocess.Popen([HOST_PYTHON, "-I", "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
        proc.stdin.write(script)  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
        _, status, usage = os.wait4(proc.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        return usage.ru_utime + usage.ru_stime

    with _fake_node("kvf-bench-probe-") as (_, _, env):
        res: List[List[float]] = [[] for _ in trees]
        bare: List[float] = []
        for _ in range(RUNS):
            for i, script in enumerate(scripts):
                res[i].append(cpu(script, env))
            bare.append(cpu(b"pass\n", env))
    return [statistics.median(r) for r in res], statistics.median(bare)


def serve_cpu(trees: List[Path], scrapes: int = 10) -> List[float]:
    """CPU per sample of the resident collector, ``serve --min-interval 0`` on the 8-GPU fake node: the
    process's own CPU (all its threads, /proc/PID/stat) over ``scrapes`` scrapes after a first one, each
    scrape one sample into the history. What a node pays per sample when nothing is imported again."""
    import urllib.request

    from tests.sshd import free_port

    tick = os.sysconf("SC_CLK_TCK")

    def cpu(pid: int) -> float:
        fields = Path("/proc/{}/stat".format(pid)).read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    out = []
    with _fake_node("kvf-bench-serve-") as (work, lib, env):
        for i, tree in enumerate(trees):
            port = free_port()
            proc = subprocess.Popen([sys.executable, "-m", "kvforensics", "serve", "--listen",
                                     "127.0.0.1:{}".format(port),
                                     "--db", str(work / "s{}.db".format(i)), "--min-interval", "0", "--nvml-lib",
                                     str(lib), "--no-http"], cwd=str(tree), env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            try:
                url = "http://127.0.0.1:{}/metrics".format(port)
                deadline = time.monotonic() + 60
                while True:
                    try:
                        urllib.request.urlopen(url, timeout=60).read()  # the first sample: imports, history
                        break
                    except OSError:
                        assert time.monotonic() < deadline and proc.poll() is None, "serve did not start"
                        time.sleep(0.1)
                before = cpu(proc.pid)
                for _ in range(scrapes):
                    urllib.request.urlopen(url, timeout=60).read()
                out.append((cpu(proc.pid) - before) / scrapes)
            finally:
                proc.terminate()
                proc.wait(30)
    return out


def probe_bytes(tree: Path) -> int:
    code = ("from kvforensics.agent.remote import probe; "
            "print(len(probe.build({'nvml_lib': None, 'log': None, 'startup': -1, 'model_config_path': None, "
            "'http': False}).script))")
    return int(subprocess.run([sys.executable, "-c", code], cwd=str(tree), capture_output=True, text=True,
                              check=True).stdout)


def fleet(trees: List[Path]) -> Tuple[List[float], float]:
    from bench.common import ssh_fleet
    from tests.sshd import Sshd, keygen

    work = Path(tempfile.mkdtemp(prefix="kvf-bench-perf-ssh-"))
    key = keygen(work / "client")
    server = Sshd(work / "sshd", [key])
    try:
        cfg, aliases, env = ssh_fleet(work, server, key, HOSTS)
        kvf: List[List[float]] = [[] for _ in trees]
        peer: List[float] = []
        for _ in range(FLEET_RUNS):
            for i, tree in enumerate(trees):
                cmd = [sys.executable, "-m", "kvforensics", "inspect", "--ssh-config", str(cfg), "--parallel",
                       str(PARALLEL), "--no-http", "--json", "--fail-on", "never"] + aliases
                kvf[i].append(_measure(cmd, tree, env, ok=(0,))[0])
            start = time.perf_counter()
            proc = subprocess.run(["xargs", "-P", str(PARALLEL), "-I{}", "ssh", "-F", str(cfg), "{}", "python3", "-c",
                                   "pass"], input="\n".join(aliases) + "\n", env=env, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[-2000:]
            peer.append(time.perf_counter() - start)
        return [statistics.median(k) for k in kvf], statistics.median(peer)
    finally:
        server.stop()


def main() -> int:
    base, label = base_tree()
    trees = [base, ROOT]
    a = analyze(trees)
    r = record(trees)
    p = [probe_bytes(t) for t in trees]
    pc, bare = probe_cpu(trees)
    sv = serve_cpu(trees)
    skip_fleet = os.environ.get("KVF_BENCH_NO_FLEET")
    f, peer = fleet(trees) if not skip_fleet else ([float("nan")] * 2, float("nan"))
    rows = [
        "| measure | before ({}) | after (this tree) | after ÷ before |".format(label), "|---|---|---|---|",
        "| `analyze SEED_LOG --json` wall (small log) | {:.3f} s | {:.3f} s | {:.2f} |".format(a[0][0], a[1][0],
                                                                                           a[1][0] / a[0][0]),
        "| `analyze SEED_LOG --json` CPU (user + sys) | {:.3f} s | {:.3f} s | {:.2f} |".format(a[0][1], a[1][1],
                                                                                             a[1][1] / a[0][1]),
        "| `analyze` ÷ `python -c pass` ({:.3f} s wall, {:.3f} s CPU), wall | {:.1f}× | {:.1f}× | |".format(
            a[2][0], a[2][1], a[0][0] / a[2][0], a[1][0] / a[2][0]),
        "| `record` on the 8-GPU fake node, CPU per run | {:.3f} s | {:.3f} s | {:.2f} |".format(r[0][0], r[1][0],
                                                                                              r[1][0] / r[0][0]),
        "| `record` peak RSS | {:.0f} MB | {:.0f} MB | {:.2f} |".format(r[0][1] / 1e6, r[1][1] / 1e6,
                                                                    r[1][1] / r[0][1]),
        "| `record`, CPU per sample, 6 samples per run (the shipped cron/systemd line) | {:.3f} s | {:.3f} s | "
        "{:.2f} |".format(r[0][2], r[1][2], r[1][2] / r[0][2]),
        "| `serve --min-interval 0`, CPU per sample (resident: one scrape, one sample) | {:.3f} s | {:.3f} s | "
        "{:.2f} |".format(sv[0], sv[1], sv[1] / sv[0]),
        "| probe bytes on the wire (one exec) | {:,} | {:,} | {:.2f} |".format(p[0], p[1], p[1] / p[0]),
        "| probe CPU on the 8-GPU fake node (`{} -I -`; given `pass`: {:.3f} s) | {:.3f} s | {:.3f} s | "
        "{:.2f} |".format(HOST_PYTHON, bare, pc[0], pc[1], pc[1] / pc[0]),
        "| fleet, {} loopback hosts, {} at a time | {:.2f} s | {:.2f} s | {:.2f} |".format(
            HOSTS, PARALLEL, f[0], f[1], f[1] / f[0]),
        "| fleet ÷ `xargs -P {} ssh HOST python3 -c pass` ({:.2f} s) | {:.2f} | {:.2f} | |".format(
            PARALLEL, peer, f[0] / peer, f[1] / peer),
        "", "Medians of {} alternating runs ({} for the fleet), same interpreter, same load; other jobs shared the "
        "machine, so compare the columns, not the absolute figures with earlier sections.".format(RUNS, FLEET_RUNS)]
    append("before/after: pay only for what a command uses", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
