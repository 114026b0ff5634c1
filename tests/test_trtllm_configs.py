"""TensorRT-LLM's settings from the files its command line names, read as the probe reads them: real files
through /proc/PID/root and /proc/PID/cwd of a real process, the owner rule, and the two formats."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvforensics.collectors.trtllm import configs

YAML = """\
# trtllm-serve --extra_llm_api_options
kv_cache_config:
  free_gpu_memory_fraction: 0.85   # leave room for the sampler
  max_tokens: 200000
  dtype: fp8
  enable_block_reuse: false
scheduler_config:
  capacity_scheduler_policy: MAX_UTILIZATION
max_batch_size: 128
cuda_graph_config:
  batch_sizes: [1, 2, 4]
print_iter_log: true
"""
PBTXT = """\
name: "tensorrt_llm"
backend: "tensorrtllm"
max_batch_size: 64
parameters: {
  key: "kv_cache_free_gpu_mem_fraction"
  value: {
    string_value: "0.8"
  }
}
parameters: {
  key: "max_tokens_in_paged_kv_cache"
  value: { string_value: "${max_tokens_in_paged_kv_cache}" }
}
parameters: { key: "batch_scheduler_policy" value: { string_value: "guaranteed_no_evict" } }
"""


def test_the_yaml_keys_kvforensics_reads():
    leaves = configs.parse_yaml(YAML)
    assert leaves[("kv_cache_config", "free_gpu_memory_fraction")] == 0.85
    assert leaves[("kv_cache_config", "max_tokens")] == 200000
    assert leaves[("kv_cache_config", "enable_block_reuse")] is False
    assert leaves[("scheduler_config", "capacity_scheduler_policy")] == "MAX_UTILIZATION"
    assert leaves[("max_batch_size",)] == 128
    assert ("cuda_graph_config", "batch_sizes") not in leaves  # a list is skipped, not misread
    assert configs.parse_yaml("kv_cache_config: {free_gpu_memory_fraction: 0.7, max_tokens: 4096}\n") == {
        ("kv_cache_config", "free_gpu_memory_fraction"): 0.7, ("kv_cache_config", "max_tokens"): 4096}


def test_the_pbtxt_parameters_and_a_template_placeholder():
    backend, params = configs.parse_pbtxt(PBTXT)
    assert backend == "tensorrtllm"
    assert params == {"kv_cache_free_gpu_memory_fraction": 0.8, "capacity_scheduler_policy": "guaranteed_no_evict"}


@pytest.fixture
def server(tmp_path):
    """A real process whose working folder holds the config files (named relative to it)."""
    (tmp_path / "extra.yaml").write_text(YAML)
    model = tmp_path / "models" / "tensorrt_llm"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(PBTXT)
    (tmp_path / "models" / "preprocessing").mkdir()
    (tmp_path / "models" / "preprocessing" / "config.pbtxt").write_text('backend: "python"\n')
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=str(tmp_path))
    try:
        yield p.pid, tmp_path
    finally:
        p.kill()
        p.wait()


def test_a_servers_relative_yaml_is_read_through_its_working_folder(server):
    pid, folder = server
    flags, notes = configs.config_flags("/", pid, os.getuid(), {"extra_llm_api_options": "extra.yaml"})
    assert notes == []
    assert flags == {"kv_cache_free_gpu_memory_fraction": 0.85, "max_tokens": 200000, "kv_cache_dtype": "fp8",
                     "enable_block_reuse": False, "capacity_scheduler_policy": "MAX_UTILIZATION",
                     "max_batch_size": 128, "config_file": str(folder / "extra.yaml")}


def test_tritons_model_repository_finds_the_tensorrtllm_model(server):
    pid, folder = server
    flags, notes = configs.config_flags("/", pid, os.getuid(), {"model_repository": "models"})
    assert flags["kv_cache_free_gpu_memory_fraction"] == 0.8 and notes == []
    assert flags["config_file"] == str(folder / "models" / "tensorrt_llm" / "config.pbtxt")


def test_a_file_of_another_user_a_fifo_and_a_link_are_not_read(server, tmp_path):
    pid, folder = server
    other = os.getuid() + 4242
    flags, notes = configs.config_flags("/", pid, other if os.getuid() == 0 else os.getuid(),
                                        {"extra_llm_api_options": "extra.yaml"})
    if os.getuid() == 0:  # root's file counts as the owner's: make it another user's
        os.chown(folder / "extra.yaml", other, other)
        flags, notes = configs.config_flags("/", pid, os.getuid(), {"extra_llm_api_options": "extra.yaml"})
        assert flags == {} and "owned by uid {}".format(other) in notes[0]
    os.mkfifo(str(folder / "pipe.yaml"))
    flags, notes = configs.config_flags("/", pid, os.getuid(), {"config": "pipe.yaml"})  # never blocks on a FIFO
    assert flags == {} and "not a regular file" in notes[0]
    os.symlink("/etc/passwd", str(folder / "link.yaml"))
    flags, notes = configs.config_flags("/", pid, os.getuid(), {"config": "link.yaml"})
    assert flags == {} and "cannot open it" in notes[0]


def test_an_implausible_value_is_no_value():
    assert configs.scalar("1e400") is None and not isinstance(configs.scalar("nan"), float)
    assert configs.scalar("'; rm -rf /'") is None and configs.scalar("0.9") == 0.9
