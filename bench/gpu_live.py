"""Live vLLM inspection on a real NVIDIA GPU: `python3 bench/gpu_live.py` (on a lent GPU machine).

A stand-in for `vllm serve` (the launch form `python -m vllm.entrypoints.openai.api_server`) starts a
child titled `VLLM::EngineCore` (the TP=1 engine core that holds the GPU, as vLLM 0.10.2+ names it)
which takes real GPU memory through the CUDA driver API (ctypes: cuInit, cuCtxCreate, cuMemAlloc,
cuMemsetD8) the way vLLM's budget would fill it: T·u minus the activation peak it frees after
profiling. The server then prints a vLLM 0.27-shaped startup log with the engine core's real PID.
`kvforensics inspect --json` and `kvforensics record --prom-file` run against it, as subprocesses,
over the real driver. Checks:
* the engine is vLLM, found by its command line; GPU 0's rank is the log's EngineCore_DP0, and the
  holder's PID (real NVML, real /proc) is the engine's, holding at least the allocation;
* the ledger's items sum to NVML's total; weights and KV pool are the log's figures;
* the unused memory is the by-design figure: min(NVML free, total − reserved − T·u − context) − margin,
  with T = NVML total − reserved (what cuMemGetInfo reports: bench/RESULTS.md);
* the Prometheus textfile carries engine="vllm-<port>" and rank="EngineCore_DP0".
Prints every figure, writes them to $KVF_GPU_LIVE_OUT (if set), exits 1 on a mismatch.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import CUDA_CONTEXT_PROGRAM  # noqa: E402
from kvforensics.collectors import nvml  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
U = 0.9
ACTIVATION = 5 * GIB  # profiled into the budget, released after profiling: not held now
CONTEXT = 527 * MIB  # agent/vllm/analysis.py CUDA_CONTEXT_BYTES
MARGIN = 2 * GIB  # kvforensics' default --margin

ENGINE_CORE = CUDA_CONTEXT_PROGRAM.replace("DEVICE", "0") + r"""
ptr = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(NBYTES)), "cuMemAlloc")
check(cuda.cuMemsetD8_v2(ptr, 0, ctypes.c_size_t(NBYTES)), "cuMemsetD8")
check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
print(json.dumps({"pid": os.getpid()}), flush=True)
while True:
    time.sleep(3600)
"""

SERVER = r'''
"""Stands in for vLLM's OpenAI API server: an engine core holding the GPU, and its startup log."""
import json, os, subprocess, sys, time
core = subprocess.Popen(["VLLM::EngineCore"], executable=sys.executable, stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE)
core.stdin.write(open(os.environ["GPU_LIVE_CORE"], "rb").read())
core.stdin.close()
answer = json.loads(core.stdout.readline() or '{"error": "the engine core printed nothing"}')
if "error" in answer:
    print("engine core failed:", answer["error"], flush=True)
    sys.exit(1)
print(open(os.environ["GPU_LIVE_LOG"]).read().format(server=os.getpid(), core=answer["pid"]), end="", flush=True)
open(os.environ["GPU_LIVE_READY"], "w").write(str(answer["pid"]))
while True:
    time.sleep(3600)
'''

LOG = textwrap.dedent("""\
    (APIServer pid={{server}}) INFO 11-30 09:00:01 [api_server.py:1842] vLLM API server version 0.27.0
    (EngineCore_DP0 pid={{core}}) INFO 11-30 09:00:09 [core.py:93] Initializing a V1 LLM engine (v0.27.0) with config: model='meta-llama/Llama-3.1-70B-Instruct', dtype=torch.bfloat16, max_seq_len=131072, tensor_parallel_size=1, kv_cache_dtype=auto
    (EngineCore_DP0 pid={{core}}) INFO 11-30 09:01:10 [gpu_model_runner.py:3410] Model loading took {weights:.4f} GiB and 58.121023 seconds
    (EngineCore_DP0 pid={{core}}) INFO 11-30 09:01:31 [gpu_worker.py:410] Available KV cache memory: {kv} GiB
    (EngineCore_DP0 pid={{core}}) INFO 11-30 09:01:32 [kv_cache_utils.py:1291] GPU KV cache size: 355,200 tokens
    (EngineCore_DP0 pid={{core}}) INFO 11-30 09:01:53 [core.py:250] init engine (profile, create kv cache, warmup model) took 43.20 seconds
    (APIServer pid={{server}}) INFO 11-30 09:02:01 [api_server.py:1910] Starting vLLM API server 0 on http://0.0.0.0:{port}
    """)  # noqa: E501 - log lines are as vLLM prints them


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(args: list, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvforensics"] + args, cwd=str(ROOT), env=env, capture_output=True,
                          text=True, timeout=120)


# Without a GPU (KVF_GPU_LIVE_FAKE_LIB=<the fake libnvidia-ml.so.1>; the test suite runs this): the
# engine core takes no memory and the fake NVML driver reports an H200 as a real one did.
FAKE_LIB = os.environ.get("KVF_GPU_LIVE_FAKE_LIB")
NO_CUDA_CORE = r"""
import json, os, time
print(json.dumps({"pid": os.getpid()}), flush=True)
while True:
    time.sleep(3600)
"""
H200 = (143771 * MIB, 644939776)  # NVML total and reserved on a real H200 (bench/RESULTS.md)


def _fake_scenario(path: Path, core_pid: int, alloc: int) -> None:
    total, reserved = H200
    used = alloc + CONTEXT
    path.write_text("driver 580.159.04\ngpu 0 uuid=GPU-0 name=NVIDIA_H200 bus=00000000:06:00.0 total={} reserved={} "
                    "used={} free={}\nproc 0 compute {} {}\n".format(total, reserved, used, total - reserved - used,
                                                                     core_pid, used))


def main() -> int:
    gpu = {"total_bytes": H200[0], "reserved_bytes": H200[1]} if FAKE_LIB else nvml.collect()["gpus"][0]
    total, reserved = gpu["total_bytes"], gpu["reserved_bytes"]
    cuda_total = total - reserved
    alloc = int(cuda_total * U) - ACTIVATION
    weights, kv = 60 * GIB, round(alloc / GIB - 60.5, 2)  # 0.5 GiB non-torch: not in this log
    port = _port()
    failures: list = []
    figures: dict = {"nvml_total": total, "nvml_reserved": reserved, "alloc": alloc, "port": port}
    with tempfile.TemporaryDirectory() as d:
        pkg = Path(d) / "pkgs" / "vllm" / "entrypoints" / "openai"
        pkg.mkdir(parents=True)
        for p in (pkg.parent.parent, pkg.parent, pkg):
            (p / "__init__.py").write_text("")
        (pkg / "api_server.py").write_text(SERVER)
        (Path(d) / "core.py").write_text(NO_CUDA_CORE if FAKE_LIB else ENGINE_CORE.replace("NBYTES", str(alloc)))
        (Path(d) / "log.txt").write_text(LOG.format(weights=weights / GIB, kv=kv, port=port))
        log, ready = Path(d) / "server.log", Path(d) / "ready"
        core_pid = -1
        env = dict(os.environ, PYTHONPATH=str(Path(d) / "pkgs"), GPU_LIVE_CORE=str(Path(d) / "core.py"),
                   GPU_LIVE_LOG=str(Path(d) / "log.txt"), GPU_LIVE_READY=str(ready))
        with open(log, "w") as out:
            server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                                       "meta-llama/Llama-3.1-70B-Instruct", "--gpu-memory-utilization", str(U),
                                       "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        try:
            deadline = time.time() + 120
            while not ready.exists() and server.poll() is None and time.time() < deadline:
                time.sleep(0.1)
            if not ready.exists():
                print("gpu-live: the stand-in server did not start:", log.read_text()[-2000:])
                return 1
            core_pid = int(ready.read_text())
            cli_env, lib = dict(os.environ), []
            if FAKE_LIB:
                _fake_scenario(Path(d) / "scenario.txt", core_pid, alloc)
                cli_env["FAKE_NVML_SCENARIO"] = str(Path(d) / "scenario.txt")
                lib = ["--nvml-lib", FAKE_LIB]
            start = time.perf_counter()
            got = _cli(["inspect", "--json"] + lib, cli_env)
            figures["inspect_wall_s"] = round(time.perf_counter() - start, 3)
            prom = Path(d) / "kvf.prom"
            rec = _cli(["record", "--db", str(Path(d) / "h.db"), "--prom-file", str(prom)] + lib, cli_env)
            prom_text = prom.read_text() if prom.exists() else ""
        finally:
            os.killpg(server.pid, 9)
            server.wait(timeout=30)
            # The driver frees a large context some moments after SIGKILL: leave the GPU as found.
            deadline = time.time() + 30
            while os.path.exists("/proc/{}".format(core_pid)) and time.time() < deadline:
                time.sleep(0.1)
    if got.returncode not in (0, 1):
        print("gpu-live: inspect failed:", got.stderr[-2000:])
        return 1
    t = json.loads(got.stdout)["targets"][0]
    g = t["gpus"][0]
    figures.update(core_pid=core_pid, gpu=g, findings=[(f["code"], f["bytes"], f["title"]) for f in t["findings"]],
                   record_rc=rec.returncode, record_err=rec.stderr[-500:])
    print("inspect: status {}, engine {}, {:.2f} s".format(t["status"], (t["engine"] or {}).get("name"),
                                                           figures["inspect_wall_s"]))
    print("GPU 0: rank {}; processes {}".format(g["rank"], [(p["pid"], p["owner"], p["used_bytes"])
                                                              for p in g["processes"]]))
    for item in g["ledger"]:
        print("   {:40s} {:>18,}".format(item["item"], item["bytes"] or 0))
    for f in t["findings"]:
        print("finding:", f["code"], f["severity"], f["title"])
    held = next((p for p in g["processes"] if p["pid"] == core_pid), None)
    if (t["engine"] or {}).get("name") != "vllm":
        failures.append("engine is {}".format(t["engine"]))
    if g["rank"] != "EngineCore_DP0":
        failures.append("GPU 0 rank {!r}, expected EngineCore_DP0".format(g["rank"]))
    if held is None or held["owner"] != "engine" or (held["used_bytes"] or 0) < alloc:
        failures.append("engine core PID {} not held as the engine's with ≥ {} B: {}".format(core_pid, alloc, held))
    ledger = {x["item"]: x["bytes"] for x in g["ledger"]}
    if sum(x["bytes"] or 0 for x in g["ledger"]) != total:
        failures.append("ledger sums to {}, NVML total {}".format(sum(x["bytes"] or 0 for x in g["ledger"]), total))
    if ledger.get("weights") != weights or ledger.get("KV pool") != round(kv * GIB):
        failures.append("ledger weights/KV {}/{} vs the log's {}/{}".format(ledger.get("weights"),
                                                                            ledger.get("KV pool"), weights,
                                                                            round(kv * GIB)))
    room = cuda_total - int(cuda_total * U) - CONTEXT
    want = min(g["free_bytes"], room) - MARGIN
    unused = next((f["bytes"] for f in t["findings"] if f["code"] == "unused_gpu_memory"), None)
    figures.update(room=room, expected_unused=want, unused=unused)
    print("by design {:,} B, NVML free {:,} B: expected unused {:,} B, reported {}".format(room, g["free_bytes"], want,
                                                                                          unused))
    if unused != want:
        failures.append("unused {} B, expected {} B".format(unused, want))
    if rec.returncode != 0 or 'engine="vllm-{}"'.format(port) not in prom_text or 'rank="EngineCore_DP0"' \
            not in prom_text:
        failures.append("record rc {} / textfile lacks the engine or rank labels: {}".format(rec.returncode,
                                                                                            rec.stderr[-300:]))
    for f in failures:
        print("MISMATCH:", f)
    print("gpu-live: {} failed".format(len(failures)))
    out = os.environ.get("KVF_GPU_LIVE_OUT")
    if out:
        Path(out).write_text(json.dumps({"figures": figures, "failures": failures, "report": t}, indent=1,
                                        default=str))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
