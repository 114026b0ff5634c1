"""TensorRT-LLM, as the collectors see it: the one object the engine-neutral code reads.

Nothing of the engine is imported with it: its parts are ``lazy``, imported on first call (as SGLang's and
vLLM's plug-ins).
"""

from __future__ import annotations

from kvforensics.collectors.plugin import EngineCollectors
from kvforensics.collectors.registry import lazy, lazy_rows

ENGINE = EngineCollectors(
    name="trtllm",
    display="TensorRT-LLM",
    formats=lazy_rows("kvforensics.collectors.trtllm.formats:STARTUP_FORMATS"),
    idle_needles=lazy_rows("kvforensics.collectors.trtllm.formats:IDLE_NEEDLES"),
    parse_line=lazy("kvforensics.collectors.trtllm.log:parse_line"),
    segmenter=lazy("kvforensics.collectors.trtllm.startups:StartupSegmenter"),
    segment_lines=lazy("kvforensics.collectors.trtllm.startups:segment_lines"),
    # The KV manager's lines close every era's sizing (C++ and PyTorch backends alike); the PyTorch backend's
    # profiling and the C++ eras' engine load anchor a startup cut before them; an executor that failed
    # to be created prints neither.
    anchors=(b"for max tokens in paged KV cache", b"Memory usage when calculating max tokens",
             b"Peak memory during memory usage profiling", b"tokens in paged KV cache", b"Loaded engine size",
             b"Executor creation failed", b"TensorRT-LLM version: "),
    anchors_in_order=False,
    anchor_words="TensorRT-LLM startup (KV cache allocation, memory profiling, engine load or version banner)",
    end_words="the server's 'Application startup complete' (trtllm-serve) or 'Started HTTPService' (Triton)",
    no_startup_hint="'[MemUsageChange] Allocated … for max tokens in paged KV cache', 'Peak memory during memory "
                    "usage profiling', 'TensorRT-LLM version'",
    launch_lines=(b"TensorRT-LLM version: ",),
    owns_event=lazy("kvforensics.collectors.trtllm.startups:owns_event"),
    begins_cleanly=lazy("kvforensics.collectors.trtllm.startups:begins_cleanly"),
    classify=lazy("kvforensics.collectors.trtllm.processes:classify"),
    parse_flags=lazy("kvforensics.collectors.trtllm.processes:parse_flags"),
    default_port=8000,  # tensorrt_llm/commands/serve.py: --port default
    read_http=lazy("kvforensics.collectors.trtllm.http:read_http"),
    config_flags=lazy("kvforensics.collectors.trtllm.configs:config_flags"),
)
