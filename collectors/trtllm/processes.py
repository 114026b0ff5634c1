"""TensorRT-LLM's processes: which command lines are its servers and workers, and its flags.

Launch forms:
* ``trtllm-serve MODEL [options]`` (a click command; the script's command line is
  ``python3 /usr/local/bin/trtllm-serve …``), also ``trtllm-serve serve MODEL`` and
  ``python -m tensorrt_llm.commands.serve``; its options are spelt with underscores
  (``--kv_cache_free_gpu_memory_fraction``, ``--tp_size``, ``--extra_llm_api_options``, ``--config``).
* ``trtllm-llmapi-launch trtllm-serve …`` under ``mpirun``/``srun`` (multi-node): each rank's process.
* Triton's ``tritonserver --model-repository=…`` with the ``tensorrtllm`` backend (one process per rank
  under ``mpirun``, launched by ``launch_triton_server.py``); its KV options live in the model's
  ``config.pbtxt``, not on the command line.
* NVIDIA Dynamo's worker ``python3 -m dynamo.trtllm --model-path … --extra-engine-args FILE``.

Workers: the LLM API runs its executor in MPI processes it spawns through mpi4py
(``python3 -m mpi4py.futures.server``) even at TP 1 in the PyTorch backend, and Triton's orchestrator
mode spawns ``trtllmExecutorWorker``: each is a worker only under a TensorRT-LLM server.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from kvforensics.collectors.argv import parse_flags as _parse

ENGINE = "trtllm"

# Options kvforensics reads, by the spelling each launcher uses (trtllm-serve: underscores; Dynamo: hyphens).
_KNOWN = ("kv_cache_free_gpu_memory_fraction", "free_gpu_memory_fraction", "max_batch_size", "max_num_tokens",
          "max_seq_len", "max_beam_width", "tp_size", "pp_size", "ep_size", "backend", "extra_llm_api_options",
          "config", "port", "host", "model_path", "extra_engine_args", "tensor_parallel_size",
          "pipeline_parallel_size", "model_repository", "http_port", "tokenizer", "kv_cache_dtype",
          "served_model_name", "trust_remote_code")
_ALIASES = {"model_repo": "model_repository", "tensor_parallel_size": "tp_size", "pipeline_parallel_size": "pp_size",
            "free_gpu_memory_fraction": "kv_cache_free_gpu_memory_fraction"}
_SWITCHES = ("trust_remote_code",)
_SERVER_SCRIPTS = ("trtllm-serve",)
_SERVER_MODULES = ("tensorrt_llm.commands.serve", "dynamo.trtllm")


def _resolve(option: str) -> Optional[str]:
    if not option.startswith("--") or len(option) < 3:
        return None
    name = option[2:].replace("-", "_")
    if name not in _KNOWN:
        return None
    return _ALIASES.get(name, name)


def _is_switch(option: str) -> bool:
    return (_resolve(option) or "") in _SWITCHES


def parse_flags(argv: List[str]) -> Dict[str, Any]:
    """TensorRT-LLM's options from a command line (after the launch form); ``model`` is trtllm-serve's positional."""
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    return _parse(argv, _resolve, _is_switch, positional="model")


def _base(token: str) -> str:
    return token.rsplit("/", 1)[-1]


def classify(argv: List[str]) -> Optional[Dict[str, Any]]:
    """{"role": "server", "launch", "flags_at"} / {"role": "child", "rank"}, or None: not TensorRT-LLM's."""
    if not argv:
        return None
    for i, token in enumerate(argv[:6]):
        base = _base(token)
        if base in _SERVER_SCRIPTS:
            return {"role": "server", "launch": "trtllm-serve", "flags_at": i + 1}
        if base == "tritonserver":
            return {"role": "server", "launch": "tritonserver", "flags_at": i + 1}
        if token in _SERVER_MODULES and i > 0 and argv[i - 1] == "-m":
            return {"role": "server", "launch": "dynamo" if token.startswith("dynamo") else "trtllm-serve",
                    "flags_at": i + 1}
        if base == "trtllmExecutorWorker" or (token == "mpi4py.futures.server" and i > 0 and argv[i - 1] == "-m"):
            return {"role": "child", "rank": ""}
    return None
