"""A fake inference node made of real parts: the fake NVML driver, real processes whose command
lines are SGLang's (a server that forks `sglang::scheduler_TPn` children), and a real log on
their stdout. Used by the inspect tests and by examples/make_seed_bundle.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

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
        server = self.spawn(argv, out, dict(os.environ, PYTHONPATH=str(self.dir / "pkgs")))
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
        self.start_foreign()
        self.write_scenario()

    def spawn(self, argv: List[str], out: Any, env: Dict[str, str],
              pass_fds: Tuple[int, ...] = ()) -> subprocess.Popen:
        """Start the server, its stdout on ``out``, in a session of its own (``stop`` kills the group).
        tests/kubelet.py starts it in a pod instead."""
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=str(self.dir), env=env,
                                start_new_session=True, pass_fds=pass_fds)

    def start_foreign(self) -> None:
        """A process that is not the engine's (a training job) on each GPU of ``foreign``."""
        for gpu in self.foreign:
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "train.py", "--gpu", str(gpu)],
                                 stdout=subprocess.DEVNULL)
            self.procs.append(p)
            self.foreign_pids[gpu] = p.pid

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


# --- vLLM ---------------------------------------------------------------------------------

VLLM_LOG_V1 = ROOT / "tests" / "fixtures" / "fake_vllm" / "v1-0.27-tp2.log"
VLLM_LOG_V0 = ROOT / "examples" / "vllm-v0-complete.log"  # a real V0 TP=1 startup (no process prefixes)
H200_TOTAL = 143771 * MIB  # what NVML and nvidia-smi showed on a real H200 (bench/RESULTS.md)
H200_RESERVED = 644939776

# Stands in for `vllm serve` (V1): forks the engine core `VLLM::EngineCore`, which forks one
# `VLLM::Worker_TPn` per rank (tp>1) or holds the GPU itself (tp=1), as 0.10.2+ does. V0
# (FAKE_VLLM_ERA=v0): the server holds GPU 0 itself (V0 with --disable-frontend-multiprocessing, or
# before 0.6.0) and forks (same command line) the other ranks.
# Once the workers exist it prints the startup log with their real PIDs, then serves /metrics.
VLLM_SERVER = textwrap.dedent('''
    """Stands in for `vllm serve MODEL`: engine core, workers, a startup log with live PIDs, /metrics."""
    import http.server, json, os, socket, subprocess, sys, time
    tp, port = 1, 8000
    for i, a in enumerate(sys.argv):
        if a in ("-tp", "--tensor-parallel-size") and i + 1 < len(sys.argv):
            tp = int(sys.argv[i + 1])
        if a == "--port" and i + 1 < len(sys.argv):
            port = int(sys.argv[i + 1])
    pids = {"server": os.getpid(), "port": port}
    if os.environ.get("FAKE_VLLM_ERA") == "v0":
        for rank in range(1, tp):
            child = os.fork()
            if child == 0:  # a forked worker keeps the server's command line
                while True:
                    time.sleep(3600)
            pids["tp{}".format(rank)] = child
    else:
        # A worker reads its program from a pipe that stays open: it lives as long as the engine core.
        core_program = """
    import json, subprocess, time
    kids = [subprocess.Popen(["VLLM::Worker_TP{{}}".format(rank)], executable={exe!r}, stdin=subprocess.PIPE)
            for rank in range({tp} if {tp} > 1 else 0)]
    print(json.dumps([k.pid for k in kids]), flush=True)
    while True:
        time.sleep(3600)
    """.format(tp=tp, exe=sys.executable)
        core = subprocess.Popen(["VLLM::EngineCore"], executable=sys.executable, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        core.stdin.write(core_program.encode())
        core.stdin.close()
        workers = json.loads(core.stdout.readline())
        pids["core"] = core.pid
        pids.update({"tp{}".format(i): pid for i, pid in enumerate(workers)})
    with open(os.environ["FAKE_VLLM_LOG_TEMPLATE"]) as f:
        print(f.read().format(**pids), end="", flush=True)
    with open(os.environ["FAKE_VLLM_PIDS"] + ".tmp", "w") as f:
        json.dump(pids, f)
    os.rename(os.environ["FAKE_VLLM_PIDS"] + ".tmp", os.environ["FAKE_VLLM_PIDS"])
    metrics = open(os.environ["FAKE_VLLM_METRICS"], "rb").read() if os.environ.get("FAKE_VLLM_METRICS") else None

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics" or metrics is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(metrics)

        def log_message(self, *args):
            pass

    listen_fd = os.environ.get("FAKE_VLLM_LISTEN_FD")
    if listen_fd:  # the test bound and listens already: no window in which another process takes the port
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Metrics, bind_and_activate=False)
        server.socket = socket.socket(fileno=int(listen_fd))
    else:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Metrics)
    server.serve_forever()
''')


class FakeVllmNode(FakeNode):
    """A fake vLLM node: ``era`` "v1" (engine core + TP workers, 0.27 log) or "v0" (the server holds
    GPU 0 and forks the other ranks, a real V0 log). GPUs are H200s as a real one reported them.
    ``port`` 0 (the default): a free loopback port, bound here and handed to the server."""

    def __init__(self, workdir: Path, tp: int = 2, era: str = "v1", port: int = 0,
                 free_bytes: Optional[List[int]] = None, foreign: Optional[Dict[int, int]] = None,
                 metrics_text: Optional[str] = None, log_template: Optional[Path] = None,
                 extra_flags: Optional[List[str]] = None, total: int = H200_TOTAL,
                 reserved: int = H200_RESERVED, utilization: float = 0.9) -> None:
        super().__init__(workdir, tp=tp, free_bytes=free_bytes or [int(17.5 * GIB)] * tp, foreign=foreign,
                         extra_flags=extra_flags)
        self.era = era
        self.port = port
        self.metrics_text = metrics_text
        self.template = log_template or (VLLM_LOG_V0 if era == "v0" else VLLM_LOG_V1)
        self.pids: Dict[str, int] = {}
        self.total, self.reserved = total, reserved
        self.utilization = utilization  # on the command line: keep it what the log's run used

    def start(self) -> None:
        pkg = self.dir / "pkgs" / "vllm" / "entrypoints" / "openai"
        pkg.mkdir(parents=True, exist_ok=True)
        for d in (pkg.parent.parent, pkg.parent, pkg):
            (d / "__init__.py").write_text("")
        (pkg / "api_server.py").write_text(VLLM_SERVER)
        template = self.dir / "log-template.txt"
        template.write_text(self.template.read_text().replace("{", "{{").replace("}", "}}")
                            if self.template == VLLM_LOG_V0 else self.template.read_text())
        env = dict(os.environ, PYTHONPATH=str(self.dir / "pkgs"), FAKE_VLLM_ERA=self.era,
                   FAKE_VLLM_LOG_TEMPLATE=str(template), FAKE_VLLM_PIDS=str(self.dir / "pids.json"))
        if self.metrics_text is not None:
            (self.dir / "metrics.txt").write_text(self.metrics_text)
            env["FAKE_VLLM_METRICS"] = str(self.dir / "metrics.txt")
        listener = None
        if self.port == 0:  # pick a free loopback port and hand the listening socket to the server
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(16)
            self.port = listener.getsockname()[1]
            env["FAKE_VLLM_LISTEN_FD"] = str(listener.fileno())
        out = open(self.log, "w")
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                "meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", str(self.tp),
                "--gpu-memory-utilization", str(self.utilization), "--api-key", "sk-do-not-print", "--port",
                str(self.port)]
        server = self.spawn(argv + self.extra_flags, out, env,
                            pass_fds=(listener.fileno(),) if listener is not None else ())
        out.close()
        if listener is not None:
            listener.close()  # the server holds its copy
        self.pids = self._started(server, "the fake vLLM server")
        # The GPU holder of each rank: V1 TP>1 the workers, TP=1 the engine core; V0 the server, then its forks.
        if self.era == "v0":
            holders = [self.server_pid] + [self.pids["tp{}".format(r)] for r in range(1, self.tp)]
        elif self.tp > 1:
            holders = [self.pids["tp{}".format(r)] for r in range(self.tp)]
        else:
            holders = [self.pids["core"]]
        self.scheduler_pids = dict(enumerate(holders))
        self.start_foreign()
        self.write_scenario()

    def _started(self, server: subprocess.Popen, what: str) -> Dict[str, Any]:
        """The PIDs the fake server wrote once its processes were up (pids.json); stopped and said otherwise."""
        import json

        self.procs.append(server)
        self.server_pid = server.pid
        pids_file = self.dir / "pids.json"
        deadline = time.time() + 20
        while not pids_file.exists() and time.time() < deadline and server.poll() is None:
            time.sleep(0.05)
        if not pids_file.exists():
            self.stop()
            raise RuntimeError(what + " did not start: " + self.log.read_text()[-2000:])
        return json.loads(pids_file.read_text())

    def write_scenario(self) -> None:
        lines = ["driver 580.159.04", "nvml 13.580.159.04", "cuda 13000"]
        for gpu in range(self.tp):
            foreign = self.foreign.get(gpu, 0)  # beside the engine: it takes free memory, not the engine's
            used = self.total - self.reserved - self.free[gpu] + foreign
            lines.append("gpu {} uuid=GPU-46a67de8-4cd8-5331-398c-b6718dd7{:04x} name=NVIDIA_H200 "
                         "bus=00000000:{:02X}:00.0 total={} reserved={} used={} free={}".format(
                             gpu, gpu, 0x06 + gpu, self.total, self.reserved, used, self.free[gpu] - foreign))
            lines.append("proc {} compute {} {}".format(gpu, self.scheduler_pids[gpu], used - foreign))
            if foreign:
                lines.append("proc {} compute {} {}".format(gpu, self.foreign_pids[gpu], foreign))
        self.scenario.write_text("\n".join(lines) + "\n")


# --- TensorRT-LLM ---------------------------------------------------------------------------

# Stands in for `trtllm-serve MODEL --tp_size N` (PyTorch backend): N MPI workers as mpi4py spawns them
# (`python -m mpi4py.futures.server`, children of the server), the startup log on its stdout, and
# /prometheus/metrics when the test gives a page.
TRTLLM_SERVE = textwrap.dedent('''
    """Stands in for trtllm-serve: mpi4py workers, a startup log, /prometheus/metrics."""
    import http.server, json, os, socket, subprocess, sys
    tp, port = 1, 8000
    for i, a in enumerate(sys.argv):
        if a == "--tp_size" and i + 1 < len(sys.argv):
            tp = int(sys.argv[i + 1])
        if a == "--port" and i + 1 < len(sys.argv):
            port = int(sys.argv[i + 1])
    # A worker reads its stdin until the server's end of the pipe closes: it lives as long as the server.
    kids = [subprocess.Popen([sys.executable, "-m", "mpi4py.futures.server"], stdin=subprocess.PIPE)
            for _ in range(tp)]
    with open(os.environ["FAKE_TRTLLM_LOG_TEMPLATE"]) as f:
        print(f.read(), end="", flush=True)
    pids = {"server": os.getpid(), "workers": [k.pid for k in kids], "port": port}
    with open(os.environ["FAKE_TRTLLM_PIDS"] + ".tmp", "w") as f:
        json.dump(pids, f)
    os.rename(os.environ["FAKE_TRTLLM_PIDS"] + ".tmp", os.environ["FAKE_TRTLLM_PIDS"])
    page = open(os.environ["FAKE_TRTLLM_METRICS"], "rb").read() if os.environ.get("FAKE_TRTLLM_METRICS") else None

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/prometheus/metrics" or page is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Metrics, bind_and_activate=False)
    server.socket = socket.socket(fileno=int(os.environ["FAKE_TRTLLM_LISTEN_FD"]))
    server.serve_forever()
''')
MPI_WORKER = "import sys\nsys.stdin.read()\n"


def trtllm_pytorch_log(tp: int, total_gib: float, peak_gib: float, tmp_gib: float, weights_gib: float,
                       bytes_per_token: int, fraction: str = "0.8999999761581421") -> Tuple[str, Dict[str, float]]:
    """A TP=``tp`` PyTorch-backend startup in 1.1.0rc3's line shapes (tests/fixtures/real_trtllm/py01, whose
    ranks carry ``[RANK n]`` as 1.1.0rc2's workers print), its figures computed by the release's rules: the
    budget F × (total − peak + temporary pool), max_tokens = budget ÷ bytes per token, the pool ceil'd to
    32-token blocks (resource_manager.py, the older ceil). Returns (log, figures in GiB)."""
    f = float(fraction)
    budget = round(f * (total_gib - peak_gib + tmp_gib), 2)
    max_tokens = int(budget * GIB // bytes_per_token)
    tokens = -(-max_tokens // 32) * 32
    kv = round(tokens * bytes_per_token / GIB, 2)
    tmp_tokens = 8224
    stamp = "[12/20/2025-04:2{}:{:02d}] [TRT-LLM] [RANK {}] [{}] "
    lines = ["[TensorRT-LLM] TensorRT-LLM version: 1.1.0rc3",
             "[12/20/2025-04:20:04] [TRT-LLM] [I] Using LLM with PyTorch backend"]
    lines += ["[TensorRT-LLM] TensorRT-LLM version: 1.1.0rc3"] * tp

    def each(minute: int, second: int, level: str, text: str) -> None:
        lines.extend(stamp.format(minute, second, r, level) + text for r in range(tp))

    each(0, 21, "I", "Use {:.2f} GB for model weights.".format(weights_gib - 0.1))
    each(1, 10, "W", "Both free_gpu_memory_fraction and max_tokens are set (to {} and {}, respectively). The smaller "
                     "value will be used.".format(fraction, tmp_tokens))
    lines += ["[TensorRT-LLM][INFO] Number of tokens per block: 32."] * tp
    lines += ["[TensorRT-LLM][INFO] [MemUsageChange] Allocated {:.2f} GiB for max tokens in paged KV cache ({})."
              .format(tmp_gib, tmp_tokens)] * tp
    each(1, 10, "I", "max_seq_len=8224, max_num_requests=64, max_num_tokens=8192, max_batch_size=64")
    each(1, 50, "I", "Memory used after loading model weights (inside torch) in memory usage profiling: {:.2f} GiB"
                     .format(weights_gib))
    each(1, 51, "I", "Peak memory during memory usage profiling (torch + non-torch): {:.2f} GiB, available KV cache "
                     "memory when calculating max tokens: {:.2f} GiB, fraction is set {}, kv size is {}. device total "
                     "memory {:.2f} GiB, , tmp kv_mem {:.2f} GiB".format(peak_gib, budget, fraction, bytes_per_token,
                                                                        total_gib, tmp_gib))
    each(1, 51, "I", "Estimated max memory in KV cache : {:.2f} GiB".format(budget))
    each(1, 51, "W", "Both free_gpu_memory_fraction and max_tokens are set (to {} and {}, respectively). The smaller "
                     "value will be used.".format(fraction, max_tokens))
    lines += ["[TensorRT-LLM][INFO] Number of tokens per block: 32."] * tp
    lines += ["[TensorRT-LLM][INFO] [MemUsageChange] Allocated {:.2f} GiB for max tokens in paged KV cache ({})."
              .format(kv, tokens)] * tp
    each(1, 52, "I", "max_seq_len=131072, max_num_requests=64, max_num_tokens=8192, max_batch_size=64")
    each(1, 57, "I", "Setting PyTorch memory fraction to 0.31 (43.3 GiB)")
    lines += ["INFO:     Started server process [41]", "INFO:     Waiting for application startup.",
              "INFO:     Application startup complete.", "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press "
              "CTRL+C to quit)"]
    return "\n".join(lines) + "\n", {"budget": budget, "kv": kv, "tokens": tokens, "max_tokens": max_tokens}


class FakeTrtllmNode(FakeVllmNode):
    """A fake trtllm-serve node on H200s: the server and its ``tp`` mpi4py workers, one per GPU, each holding
    ``total − reserved − free`` as NVML reports it; ``log_text`` is the server's stdout."""

    def __init__(self, workdir: Path, log_text: str, tp: int = 2, free_bytes: Optional[List[int]] = None,
                 metrics_text: Optional[str] = None, foreign: Optional[Dict[int, int]] = None) -> None:
        super().__init__(workdir, tp=tp, free_bytes=free_bytes, foreign=foreign, metrics_text=metrics_text)
        self.log_text = log_text

    def start(self) -> None:
        pkg = self.dir / "pkgs" / "mpi4py" / "futures"
        pkg.mkdir(parents=True, exist_ok=True)
        for d in (pkg.parent, pkg):
            (d / "__init__.py").write_text("")
        (pkg / "server.py").write_text(MPI_WORKER)
        script = self.dir / "bin" / "trtllm-serve"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(TRTLLM_SERVE)
        template = self.dir / "log-template.txt"
        template.write_text(self.log_text)
        env = dict(os.environ, PYTHONPATH=str(self.dir / "pkgs"), FAKE_TRTLLM_LOG_TEMPLATE=str(template),
                   FAKE_TRTLLM_PIDS=str(self.dir / "pids.json"))
        if self.metrics_text is not None:
            (self.dir / "metrics.txt").write_text(self.metrics_text)
            env["FAKE_TRTLLM_METRICS"] = str(self.dir / "metrics.txt")
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        env["FAKE_TRTLLM_LISTEN_FD"] = str(listener.fileno())
        out = open(self.log, "w")
        argv = [sys.executable, str(script), "meta-llama/Llama-3.1-70B-Instruct", "--tp_size", str(self.tp),
                "--kv_cache_free_gpu_memory_fraction", "0.9", "--port", str(self.port)]
        server = self.spawn(argv, out, env, pass_fds=(listener.fileno(),))
        out.close()
        listener.close()
        self.pids = self._started(server, "the fake trtllm-serve")
        self.scheduler_pids = dict(enumerate(self.pids["workers"]))
        self.start_foreign()
        self.write_scenario()
