"""TensorRT-LLM's command lines: which are its servers and workers, and the flags read from them
(the launch forms of tensorrt_llm/commands/serve.py, Triton's tritonserver, Dynamo's worker and mpi4py's
spawned workers)."""

from __future__ import annotations

import pytest

from kvforensics.collectors import engines
from kvforensics.collectors.trtllm import processes


@pytest.mark.parametrize("argv,role,launch", [
    (["/usr/bin/python3", "/usr/local/bin/trtllm-serve", "openai/gpt-oss-120b", "--tp_size", "8"], "server",
     "trtllm-serve"),
    (["trtllm-serve", "serve", "m", "--backend", "pytorch"], "server", "trtllm-serve"),
    (["python3", "-m", "tensorrt_llm.commands.serve", "m"], "server", "trtllm-serve"),
    (["/opt/tritonserver/bin/tritonserver", "--model-repository=/models"], "server", "tritonserver"),
    (["python3", "-m", "dynamo.trtllm", "--model-path", "/models/q", "--extra-engine-args", "e.yaml"], "server",
     "dynamo"),
    (["/usr/bin/python3", "-m", "mpi4py.futures.server"], "child", None),
    (["/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"], "child", None),
    (["vim", "trtllm-serve.md"], None, None),
    (["python3", "train.py", "--trtllm"], None, None),
])
def test_command_lines(argv, role, launch):
    got = processes.classify(argv)
    assert (got or {}).get("role") == role
    if launch:
        assert got["launch"] == launch


def test_the_engine_neutral_scan_names_trtllm_for_its_command_lines():
    assert engines.classify(["/usr/bin/python3", "/usr/local/bin/trtllm-serve", "m"])[0] == "trtllm"
    assert engines.classify(["vllm", "serve", "m"])[0] == "vllm"


def test_flags_are_read_with_underscores_hyphens_and_aliases():
    argv = ["/usr/local/bin/trtllm-serve", "serve", "Qwen/Qwen3-8B", "--tp_size", "2", "--kv_cache_free_gpu_memory_"
            "fraction", "0.85", "--max_batch_size=64", "--extra_llm_api_options", "/etc/x.yaml", "--port", "8001"]
    role = processes.classify(argv)
    flags = processes.parse_flags(argv[role["flags_at"]:])
    assert flags == {"model": "Qwen/Qwen3-8B", "tp_size": 2, "kv_cache_free_gpu_memory_fraction": 0.85,
                     "max_batch_size": 64, "extra_llm_api_options": "/etc/x.yaml", "port": 8001}
    dynamo = processes.parse_flags(["--model-path", "/m", "--free-gpu-memory-fraction", "0.7", "--tensor-parallel-size",
                                    "4"])
    assert dynamo == {"model_path": "/m", "kv_cache_free_gpu_memory_fraction": 0.7, "tp_size": 4}
