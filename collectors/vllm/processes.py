"""vLLM's processes: which command lines are its API servers, engine cores and workers, and its flags.

Launch forms (research §8.2): ``vllm serve MODEL …`` (the CLI since 0.5.x), ``python -m
vllm.entrypoints.openai.api_server --model MODEL …`` (the Docker image's entry point until
2025-10), ``python -m vllm.entrypoints.api_server`` (the legacy demo server). The top-level
process keeps its command line.

Process titles (setproctitle, prefix ``VLLM``; read in the release wheels):
* 0.10.1: ``VLLM::EngineCore``, ``VLLM::DPEngineCore_0``, ``VLLM::APIServer_0``, ``VLLM::DPCoordinator``;
  mp workers *append* ``_TP0`` / ``_PP1_TP0`` to the title they inherit (``VLLM::EngineCore_TP0``
  when forked, the spawn command line + ``_TP0`` when spawned) — v1/executor/multiproc_executor.py.
* 0.10.2+: ``VLLM::EngineCore`` / ``VLLM::EngineCore_DP0`` (v1/engine/core.py run_engine_core),
  ``VLLM::Worker_TP0``, ``VLLM::Worker_PP1_TP0``, ``VLLM::Worker_DP0_TP1_EP1`` (multiproc_executor.py
  WorkerProc.worker_main), ``VLLM::APIServer_0``, ``VLLM::DPCoordinator``; 0.33 adds ``VLLM::APIServer_DP0``.
* before 0.10.1, and V0: no titles. Workers show the parent's command line (fork) or
  ``python -c "from multiprocessing.spawn import spawn_main; …" --multiprocessing-fork`` (spawn); Ray
  actors show ``ray::RayWorkerWrapper…``. They are told apart by their parent chain (engines.py).

With TP=1 (V1) the engine core holds the GPU; with TP>1 each worker holds one. In V0 the driver
worker (rank 0) runs in the engine process: from 0.6.0 an untitled child the OpenAI server spawns
(api_server.py, frontend multiprocessing), or the server itself with --disable-frontend-multiprocessing.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from kvforensics.collectors.argv import parse_flags as _parse

ENGINE = "vllm"

_TITLE = "VLLM::"
_WORKER_TITLES = ("EngineCore", "DPEngineCore", "Worker")
_SPAWN_RANK = re.compile(r"_((?:DP\d+_)?(?:PP\d+_)?TP\d+)$")
# Short aliases vLLM's arg_utils.py declares (EngineArgs.add_cli_args), by destination.
_SHORT = {"-tp": "tensor_parallel_size", "-pp": "pipeline_parallel_size", "-dp": "data_parallel_size",
          "-q": "quantization", "-cc": "compilation_config", "-ep": "enable_expert_parallel",
          "-dcp": "decode_context_parallel_size", "-pcp": "prefill_context_parallel_size"}
# store_true options among those kvforensics reads (any --enable-*/--disable-*/--no-* too).
_SWITCHES = ("enforce_eager", "trust_remote_code", "headless", "enable_expert_parallel", "calculate_kv_scales",
             "skip_tokenizer_init", "disable_log_requests", "disable_log_stats")


# Long options kvforensics reads, for argparse's unique-prefix rule (vLLM's parser keeps allow_abbrev:
# a running server's abbreviation was unique among all its options, so one of these it starts is the
# one it meant), and the aliases (0.31+ arg_utils.py: --device-memory-utilization).
_KNOWN = ("gpu-memory-utilization", "kv-cache-memory-bytes", "tensor-parallel-size", "pipeline-parallel-size",
          "data-parallel-size", "max-model-len", "max-num-seqs", "kv-cache-dtype", "block-size",
          "num-gpu-blocks-override", "cpu-offload-gb", "swap-space", "enforce-eager", "quantization", "dtype",
          "port", "host", "model", "api-key")
_ALIASES = {"device-memory-utilization": "gpu-memory-utilization"}


def _resolve(option: str) -> Optional[str]:
    """The destination of an option: FlexibleArgumentParser reads ``--a_b`` as ``--a-b``."""
    if option in _SHORT:
        return _SHORT[option]
    if not option.startswith("--") or len(option) < 3:
        return None
    name = option[2:].replace("_", "-")
    if name.startswith("no-"):  # BooleanOptionalAction: --no-enable-prefix-caching
        name = name[3:]
    name = _ALIASES.get(name, name)
    if name not in _KNOWN:
        prefixed = [k for k in _KNOWN + tuple(_ALIASES) if k.startswith(name)]
        if len({_ALIASES.get(k, k) for k in prefixed}) == 1:
            name = _ALIASES.get(prefixed[0], prefixed[0])
    return name.replace("-", "_")


def _is_switch(option: str) -> bool:
    dest = _resolve(option) or ""
    return option.startswith(("--enable", "--disable", "--no-")) or dest in _SWITCHES


def parse_flags(argv: List[str]) -> Dict[str, Any]:
    """vLLM engine args from a command line (everything after the launch form); ``model`` is the
    positional of ``vllm serve MODEL`` or ``--model``."""
    return _parse(argv, _resolve, _is_switch, positional="model")


def _title(argv: List[str]) -> Optional[Dict[str, Any]]:
    name = argv[0][len(_TITLE):]
    if name.startswith(_WORKER_TITLES):
        return {"role": "worker", "rank": name}
    return {"role": "helper", "title": argv[0]}


def classify(argv: List[str]) -> Optional[Dict[str, Any]]:
    """{"role": "server", "launch", "flags_at"} / {"role": "worker", "rank"} / {"role": "helper", "title"} /
    {"role": "child", "rank"}: an untitled process that is a worker only under a vLLM server."""
    if not argv:
        return None
    if argv[0].startswith(_TITLE):
        return _title(argv)
    if argv[0].startswith("ray::RayWorkerWrapper"):
        return {"role": "child", "rank": "RayWorkerWrapper", "adopted": True}  # a child of the raylet
    for i, token in enumerate(argv[:4]):
        if token in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server") \
                or token.endswith("/vllm/entrypoints/openai/api_server.py"):
            return {"role": "server", "launch": "api_server", "flags_at": i + 1}
        if token.rsplit("/", 1)[-1] == "vllm" or token == "vllm.entrypoints.cli.main":
            if i + 1 < len(argv) and argv[i + 1] == "serve":
                return {"role": "server", "launch": "serve", "flags_at": i + 2}
    # 0.10.1 appends "_TP0" to a spawned worker's title: "... --multiprocessing-fork_TP0"
    if any(a.startswith("--multiprocessing-fork") for a in argv) and any("spawn_main" in a for a in argv):
        m = _SPAWN_RANK.search(argv[-1])
        return {"role": "child", "rank": m.group(1) if m else ""}
    return None
