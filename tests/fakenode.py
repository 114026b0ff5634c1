"""A fake inference node made of real parts: the fake NVML driver, real processes whose command
lines are SGLang's (a server that forks `sglang::scheduler_TPn` children), and a real log on
their stdout. Used by the inspect tests and by examples/make_seed_bundle.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
FAKE_DIR = ROOT / "tests" / "fake_nvml"
FAKE_LIB = FAKE_DIR / "build" / "libnvidia-ml.so.1"
SEED_LOG = ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log"
SEED_CONFIG = ROOT / "examples" / "kimi-k2.5-config.json"
MIB = 1 << 20
GIB = 1 << 30
TOTAL = 97887 * MIB  # RTX PRO 6000 Blackwell Server Edition, as nvidia-smi shows it
RESERVED = 546 * MIB


def build_fake_nvml() -> Path:
    """Compile the fake driver library if it is missing or older than its source."""
    src = FAKE_DIR / "fake_nvml.c"
    if FAKE_LIB.exists() and FAKE_LIB.stat().st_mtime >= src.stat().st_mtime:
        return FAKE_LIB
    FAKE_LIB.parent.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-Wall", "-shared", "-fPIC", "-o", str(FAKE_LIB), str(src), "-ldl"], check=True)
    return FAKE_LIB


LAUNCH_SERVER = textwrap.dedent('''
    """Stands in for sglang.launch_server: forks one scheduler per rank, like SGLang does."""
    import subprocess, sys, time
    tp = 1
    for i, a in enumerate(sys.argv):
        if a in ("--tp", "--tp-size", "--tensor-parallel-size") and i + 1 < len(sys.argv):
            tp = int(sys.argv[i + 1])
    kids = []
    for rank in range(tp):
        title = "sglang::scheduler_TP{}".format(rank) if tp > 1 else "sglang::scheduler"
        # argv[0] is the title (what setproctitle leaves in /proc/PID/cmdline); the child reads
        # its program from the inherited pipe, so it lives exactly as long as this server.
        kids.append(subprocess.Popen([title], executable=sys.executable, stdin=subprocess.PIPE))
    print("fake server ready", flush=True)
    while True:
        time.sleep(3600)
''')


class FakeNode:
    """Start with ``start()``, stop with ``stop()`` (or use as a context manager)."""

    def __init__(self, workdir: Path, tp: int = 8, free_bytes: Optional[List[int]] = None,
                 foreign: Optional[Dict[int, int]] = None, orphan: Optional[Dict[int, int]] = None,
                 extra_flags: Optional[List[str]] = None, log_text: Optional[str] = None) -> None:
        self.dir = workdir
        self.tp = tp
        self.free = free_bytes or [int(5.06 * GIB)] * tp
        self.foreign = foreign or {}  # gpu index -> bytes held by an unrelated process
        self.orphan = orphan or {}  # gpu index -> bytes held by a PID that does not exist
        self.extra_flags = extra_flags or []
        # bytes, not text: the seed log has a tqdm "\r" that universal newlines would split
        self.log_bytes = log_text.encode() if log_text is not None else SEED_LOG.read_bytes()
        self.procs: List[subprocess.Popen] = []
        self.scheduler_pids: Dict[int, int] = {}
        self.foreign_pids: Dict[int, int] = {}
        self.server_pid = 0

    def __enter__(self) -> "FakeNode":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def scenario(self) -> Path:
        return self.dir / "scenario.txt"

    @property
    def log(self) -> Path:
        return self.dir / "server.log"

    def env(self) -> Dict[str, str]:
        return dict(os.environ, FAKE_NVML_SCENARIO=str(self.scenario))

    def start(self) -> None:
        pkg = self.dir / "pkgs" / "sglang"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "launch_server.py").write_text(LAUNCH_SERVER)
        model = self.dir / "models" / "Kimi-K2.5-INT4"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(SEED_CONFIG.read_text())
        self.log.write_bytes(self.log_bytes)
        out = open(self.log, "a")
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--tp", str(self.tp),
                "--mem-fraction-static", "0.88", "--speculative-algorithm", "EAGLE3", "--trust-remote-code",
                "--api-key", "sk-do-not-print", "--port", "1"] + self.extra_flags
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=str(self.dir),
                                  env=dict(os.environ, PYTHONPATH=str(self.dir / "pkgs")), start_new_session=True)
        out.close()
        self.procs.append(server)
        self.server_pid = server.pid
        deadline = time.time() + 20
        while len(self.scheduler_pids) < self.tp and time.time() < deadline:
            self.scheduler_pids = self._children(server.pid)
            time.sleep(0.05)
        if len(self.scheduler_pids) < self.tp:
            self.stop()
            raise RuntimeError("fake schedulers did not start")
        for gpu in self.foreign:
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "train.py", "--gpu", str(gpu)])
            self.procs.append(p)
            self.foreign_pids[gpu] = p.pid
        self.write_scenario()

    def _children(self, ppid: int) -> Dict[int, int]:
        found = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/{}/stat".format(name)) as f:
                    stat = f.read()
                with open("/proc/{}/cmdline".format(name), "rb") as f:
                    title = f.read().split(b"\0")[0].decode()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == ppid and title.startswith("sglang::scheduler"):
                rank = title.rsplit("TP", 1)[1] if "TP" in title else "0"
                found[int(rank)] = int(name)
        return found

    def write_scenario(self) -> None:
        lines = ["driver 580.95.05", "nvml 13.580.95.05", "cuda 13000"]
        for gpu in range(self.tp):
            foreign = self.foreign.get(gpu, 0)
            orphan = self.orphan.get(gpu, 0)
            used = TOTAL - RESERVED - self.free[gpu]
            lines.append("gpu {} uuid=GPU-{:08x}-5a1e-4c0f-9b2d-7e3c1a2b{:04x} "
                         "name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition "
                         "bus=00000000:{:02X}:00.0 total={} reserved={} used={} free={}".format(
                             gpu, 0x3f2a1b00 + gpu, gpu, 0x18 + gpu, TOTAL, RESERVED, used, self.free[gpu]))
            lines.append("proc {} compute {} {}".format(gpu, self.scheduler_pids[gpu], used - foreign - orphan))
            if foreign:
                lines.append("proc {} compute {} {}".format(gpu, self.foreign_pids[gpu], foreign))
            if orphan:
                lines.append("proc {} compute {} {}".format(gpu, 4194000 + gpu, orphan))
        self.scenario.write_text("\n".join(lines) + "\n")

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL) if p.pid == self.server_pid else p.kill()
            except OSError:
                pass
            p.wait(timeout=10)
        self.procs = []
