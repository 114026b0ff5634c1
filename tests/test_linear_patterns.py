"""Every line-format row reads a hostile line in linear time: 200 KB runs of blanks, digits and word
characters, alone, beside the row's needle and inside a real line of the row, never take a pattern (or
its extractor) into quadratic backtracking. A quadratic row takes minutes on 200 KB; a linear one
milliseconds, so the bound below is generous and the test is not a timing test in disguise."""

from __future__ import annotations

import glob
import time
from typing import Dict, Tuple

import pytest

from kvforensics.collectors import lineformat
from kvforensics.collectors.lineformat import LineFormat
from kvforensics.collectors.sglang import formats as sglang_formats
from kvforensics.collectors.sglang import log as sglang_log
from kvforensics.collectors.trtllm import formats as trtllm_formats
from kvforensics.collectors.trtllm import log as trtllm_log
from kvforensics.collectors.vllm import formats as vllm_formats
from kvforensics.collectors.vllm import log as vllm_log
from tests.conftest import FIXTURES, ROOT

RUN = 200_000
FILLERS = {"blanks": " ", "digits": "7", "word characters": "w"}
BOUND_S = 2.0  # per row, all its inputs together (CPU time)
ROWS: Dict[Tuple[str, str], LineFormat] = {**{("vllm", r.name): r for r in vllm_formats.FORMATS},
                                           **{("sglang", r.name): r for r in sglang_formats.FORMATS},
                                           **{("trtllm", r.name): r for r in trtllm_formats.FORMATS}}

# Rows no fixture log prints: a line as the engine's format string writes it.
WRITTEN = {
    ("sglang", "exception_line_exc"): "RuntimeException: the scheduler stopped",
    ("sglang", "init_failed"): "Initialization failed. warmup error: ...",
    ("sglang", "oom_error"): "torch.OutOfMemoryError: CUDA error",
    ("sglang", "post_capture_sizing"): "Post-capture KV sizing: max_total_num_tokens=159277, free memory=3.21 GB",
    ("sglang", "prefill_graph_failed"): "Fail when using backend: fa3 for prefill runner",
    ("sglang", "scheduler_died"): "Rank 0 scheduler is dead. Please check if there are relevant logs.",
    ("vllm", "api_server"): "Starting vLLM API server 0 on http://0.0.0.0:8000",
    ("vllm", "server_on"): "Starting vLLM server on http://0.0.0.0:8000",
    ("vllm", "mrv2"): "Using V2 Model Runner",
    ("vllm", "cg_disabled"): "CUDA graph memory profiling is disabled. Consider changing --gpu-memory-utilization "
                             "from 0.90 to 0.88",
    ("vllm", "engine_config"): "Initializing a V1 LLM engine (v0.10.1) with config: model='m', max_seq_len=4096, "
                               "tensor_parallel_size=2, pipeline_parallel_size=1, kv_cache_dtype=auto",
    ("vllm", "kv_fp8"): "Using fp8_e4m3 data type to store kv cache. It reduces the GPU memory footprint",
    ("vllm", "no_cache_blocks"): "ValueError: No available memory for the cache blocks. Try increasing "
                                 "`gpu_memory_utilization` when initializing the engine.",
    ("vllm", "non_default_args"): "non-default args: {'model': 'm', 'gpu_memory_utilization': 0.9, "
                                  "'max_model_len': 4096, 'tensor_parallel_size': 2}",
    ("vllm", "args_wrapped_max_model_len"): "n2-7B-Instruct', 'max_model_len': 16384}",
    ("vllm", "args_wrapped_kv_cache_dtype"): "81', 'kv_cache_dtype': 'fp8'}",
    ("vllm", "args_wrapped_tensor_parallel_size"): "t', 'tensor_parallel_size': 2, 'port': 8000",
    ("vllm", "args_wrapped_kv_cache_memory_bytes"): "0, 'kv_cache_memory_bytes': '50G'}",
    ("vllm", "oom"): "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
    ("vllm", "oom_error"): "torch.OutOfMemoryError: boom",
    ("vllm", "profile_error"): "AssertionError: Error in memory profiling. Initial free memory 70.2 GiB",
    ("vllm", "stat_logger"): "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 1.0 tokens/s",
    ("trtllm", "both_set_cpp"): "Both freeGpuMemoryFraction (aka kv_cache_free_gpu_mem_fraction) and maxTokens (aka "
                                "max_tokens_in_paged_kv_cache) are set (to 0.900000 and 32768, respectively). The "
                                "smaller value will be used.",
    ("trtllm", "estimated_tokens"): "Estimated max tokens in KV cache : 123456",
    ("trtllm", "exception"): "RuntimeError: Executor creation failed",
    ("trtllm", "max_bytes_given"): "max_gpu_total_bytes=12.00 GiB is provided. New max memory is 12.00 GiB",
    ("trtllm", "max_tokens_given"): "max_tokens=100000 is provided. It limits max memory to 12.21 GiB. New "
                                    "max_memory is set to 12.21 GiB",
    ("trtllm", "max_tokens_given_11"): "max_tokens=100000 is provided, max_memory is set to 12.21 GiB",
    ("trtllm", "ready_triton"): "Started HTTPService at 0.0.0.0:8000",
    ("trtllm", "window_pool"): "[windowSize=4096] {.primaryBlocks=257, .secondayBlocks=0}",
}


def _samples() -> Dict[Tuple[str, str], str]:
    """One real message per row: the first each fixture log prints, else the written one."""
    found: Dict[Tuple[str, str], str] = {}
    for path in sorted(glob.glob(str(FIXTURES / "real_vllm" / "*.log")) + glob.glob(str(FIXTURES / "fake_vllm" /
                                                                                        "*.log"))):
        for raw in open(path, encoding="utf-8", errors="replace"):
            msg = vllm_log.split_record(raw)[3]
            hit = vllm_log.classify(msg)
            if hit:
                found.setdefault(("vllm", hit[0].name), msg)
    sglang_logs = sorted(glob.glob(str(FIXTURES / "real_sglang" / "*.log"))) + [
        str(FIXTURES / "line_formats.txt"), str(ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log")]
    for path in sglang_logs:
        for raw in open(path, encoding="utf-8", errors="replace"):
            for _, _, msg in sglang_log.split_records(raw):
                hit = sglang_log.classify(msg)
                if hit and lineformat.match([hit[0]], msg):  # not behind a 0.2.x "[gpu_id=0] "
                    found.setdefault(("sglang", hit[0].name), msg)
    for path in sorted(glob.glob(str(FIXTURES / "real_trtllm" / "*.log"))):
        for raw in open(path, encoding="utf-8", errors="replace"):
            msg = trtllm_log.split_record(raw)[5]
            hit = lineformat.match(trtllm_formats.FORMATS, msg) if msg else None
            if hit:
                found.setdefault(("trtllm", hit[0].name), msg)
    return {**WRITTEN, **found}


SAMPLES = _samples()


def test_every_row_has_a_sample_it_recognises():
    assert set(SAMPLES) == set(ROWS), "add a line for each new row to WRITTEN"
    for key, msg in SAMPLES.items():
        assert lineformat.match([ROWS[key]], msg) is not None, (key, msg)


def _inputs(row: LineFormat, sample: str, run: str):
    mid = len(sample) // 2
    yield run
    yield row.needle + run
    yield run + row.needle
    yield row.needle + " " + run + " " + row.needle
    yield sample + " " + run
    yield run + " " + sample
    yield sample[:mid] + run + sample[mid:]


@pytest.mark.parametrize("key", sorted(ROWS), ids=lambda k: "{}-{}".format(*k))
def test_a_row_reads_200_kb_runs_in_linear_time(key):
    row, sample = ROWS[key], SAMPLES[key]
    started = time.process_time()
    for filler in FILLERS.values():
        for msg in _inputs(row, sample, filler * RUN):
            lineformat.match([row], msg)  # the pattern, and the extractor's own searches when it matches
    assert time.process_time() - started < BOUND_S


@pytest.mark.parametrize("filler", sorted(FILLERS))
def test_the_line_splitters_read_200_kb_runs_in_linear_time(filler):
    run = FILLERS[filler] * RUN
    started = time.process_time()
    repeated = " [repeated 3x across cluster]"
    for raw in (run, "x" + run + "y", run + repeated, "x" + run + "y" + repeated,
                "INFO 01-01 00:00:00 [worker.py:1] " + run, "(Worker_TP0 pid=1) " + run):
        vllm_log.parse_line(raw)
    for raw in (run, "[2026-01-01 10:00:00 TP0] " + run, "svc" + run + "| x"):
        sglang_log.parse_line(raw)
    for raw in (run, "[TensorRT-LLM][INFO] " + run, "[12/20/2025-04:20:04] [TRT-LLM] [RANK 0] [I] " + run,
                "I0412 10:22:33.123456 1234 model.cc:1] " + run, "2025-01-01 10:00:00 | x | " + run):
        trtllm_log.parse_line(raw)
    assert time.process_time() - started < BOUND_S


def test_every_row_compiles():
    """Rows compile on first use (a log shows few): a broken pattern must fail here, not on a user's log."""
    for key, row in ROWS.items():
        pattern = row.pattern.compiled() if isinstance(row.pattern, lineformat.Lazy) else row.pattern
        assert pattern.pattern, key
