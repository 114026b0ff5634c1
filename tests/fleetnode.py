"""A fake node that runs two engines at once, made of the real parts of tests/fakenode.py: a fake SGLang
(TP=2, its /metrics a stand-in server on a port this process bound) and a fake vLLM (TP=2, its own /metrics
on a port the test bound), one fake NVML scenario for both (GPUs 0-1 SGLang's, 2-3 vLLM's). Used by the
fleet tests, the alert scenarios and the dashboard's live Prometheus test.

Hermetic beside another copy of the suite: every port is bound here first (port 0), and only engines whose
PIDs the scenario lists hold GPU memory, so another copy's fake engines in /proc are not explained."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path
from typing import List, Optional

from tests.conftest import ROOT
from tests.fakenode import FakeNode, FakeVllmNode, build_fake_nvml
from tests.kubelet import merge_scenarios

VLLM_METRICS = ROOT / "tests" / "fixtures" / "vllm_metrics" / "v0.11.0_v1_dp2.prom"
# What the stand-in SGLang /metrics answers: 25 % of the KV pool in use, 3 running, 1 queued.
SGLANG_METRICS = ('sglang:num_used_tokens{tp_rank="0"} 39819\nsglang:token_usage{tp_rank="0"} 0.25\n'
                  'sglang:num_running_reqs{tp_rank="0"} 3\nsglang:num_queue_reqs{tp_rank="0"} 1\n')


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = SGLANG_METRICS.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class TwoEngines:
    """``with TwoEngines(tmp_path) as node``: ``node.scenario`` for FAKE_NVML_SCENARIO, ``node.sglang`` and
    ``node.vllm`` (the fake nodes), ``node.engines`` their metric labels. ``stop_vllm()`` kills the vLLM
    engine and leaves its GPUs idle (the engine is gone, the GPUs are not)."""

    def __init__(self, workdir: Path, sglang_free_gib: float = 5.06, vllm_free_gib: float = 17.5) -> None:
        build_fake_nvml()
        self.dir = workdir
        self.metrics = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
        port = self.metrics.server_address[1]
        self.sglang = FakeNode(workdir / "sglang", tp=2, free_bytes=[int(sglang_free_gib * (1 << 30))] * 2,
                               extra_flags=["--port", str(port)])
        self.vllm: Optional[FakeVllmNode] = FakeVllmNode(workdir / "vllm", tp=2, metrics_text=VLLM_METRICS.read_text(),
                                                         free_bytes=[int(vllm_free_gib * (1 << 30))] * 2)
        self.sglang_label = "sglang-{}".format(port)
        self.vllm_label = ""
        self.scenario = workdir / "scenario.txt"

    def __enter__(self) -> "TwoEngines":
        threading.Thread(target=self.metrics.serve_forever, daemon=True).start()
        self.sglang.start()
        assert self.vllm is not None
        self.vllm.start()
        self.vllm_label = "vllm-{}".format(self.vllm.port)
        self.write_scenario()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sglang.stop()
        if self.vllm is not None:
            self.vllm.stop()
        self.metrics.shutdown()
        self.metrics.server_close()

    @property
    def engines(self) -> List[str]:
        return [self.sglang_label, self.vllm_label]

    def write_scenario(self) -> None:
        """Both nodes' GPUs in one scenario (after each node rewrote its own)."""
        nodes = [self.sglang] + ([self.vllm] if self.vllm is not None else [])
        merge_scenarios(nodes, self.scenario)  # type: ignore[arg-type]
        if self.vllm is None:  # its GPUs stay, idle: no process holds them
            text = self.scenario.read_text()
            self.scenario.write_text(text + "".join(self._idle_gpu(i) for i in (2, 3)))

    def _idle_gpu(self, index: int) -> str:
        from tests.fakenode import H200_RESERVED, H200_TOTAL

        return ("gpu {} uuid=GPU-46a67de8-4cd8-5331-398c-b6718dd7{:04x} name=NVIDIA_H200 bus=00000000:{:02X}:00.0 "
                "total={} reserved={} used=0 free={}\n").format(index, index, 0x06 + index, H200_TOTAL, H200_RESERVED,
                                                                 H200_TOTAL - H200_RESERVED)

    def set_free(self, sglang_gib: Optional[float] = None, vllm_gib: Optional[float] = None) -> None:
        if sglang_gib is not None:
            self.sglang.free = [int(sglang_gib * (1 << 30))] * 2
            self.sglang.write_scenario()
        if vllm_gib is not None and self.vllm is not None:
            self.vllm.free = [int(vllm_gib * (1 << 30))] * 2
            self.vllm.write_scenario()
        self.write_scenario()

    def stop_vllm(self) -> None:
        assert self.vllm is not None
        self.vllm.stop()
        self.vllm = None
        self.write_scenario()
