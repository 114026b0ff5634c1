"""vLLM, as the collectors see it: the one object the engine-neutral code reads.

Nothing of the engine is imported with it: its parts are ``lazy``, imported on first call. The probe scans
/proc with every engine's command-line rules (``processes``) on every host and reads a log only for an engine
it found; ``analyze`` reads a log and never a process table; the log's parts (formats: dozens of regexes,
compiled from source on the host) are loaded by what reads a log.
"""

from __future__ import annotations

from kvforensics.collectors.plugin import EngineCollectors
from kvforensics.collectors.registry import lazy, lazy_rows

ENGINE = EngineCollectors(
    name="vllm",
    display="vLLM",
    # Its serving lines (IDLE_NEEDLES) are looked for apart, only when a startup awaits its end.
    formats=lazy_rows("kvforensics.collectors.vllm.formats:STARTUP_FORMATS"),
    idle_needles=lazy_rows("kvforensics.collectors.vllm.formats:IDLE_NEEDLES"),
    parse_line=lazy("kvforensics.collectors.vllm.log:parse_line"),
    segmenter=lazy("kvforensics.collectors.vllm.startups:StartupSegmenter"),
    segment_lines=lazy("kvforensics.collectors.vllm.startups:segment_lines"),
    # No single line is in every startup: the last of any of them anchors the window. The later
    # ones find fragments that begin at profiling (V0) or at the KV report (V1).
    anchors=(b"Model loading took", b"Loading model weights took", b"Available KV cache memory",
             b"Memory profiling results:", b"the current vLLM instance can use", b" KV cache size: ",
             b"# GPU blocks: ", b"# cuda blocks: ", b"# CUDA blocks: "),
    anchors_in_order=False,
    anchor_words="vLLM startup (weights, profiling or KV cache size)",
    end_words="'init engine … took', a graph capture after the KV cache, or a serving line",
    no_startup_hint="'Model loading took', 'Available KV cache memory', '# GPU blocks', 'GPU KV cache size'",
    # vLLM before 0.10 prints no such line: the journal's invocation bounds the read.
    launch_lines=(b"non-default args:",),
    owns_event=lazy("kvforensics.collectors.vllm.startups:owns_event"),
    begins_cleanly=lazy("kvforensics.collectors.vllm.startups:begins_cleanly"),
    classify=lazy("kvforensics.collectors.vllm.processes:classify"),
    parse_flags=lazy("kvforensics.collectors.vllm.processes:parse_flags"),
    default_port=8000,  # vllm/entrypoints/openai/cli_args.py make_arg_parser: --port default
    read_http=lazy("kvforensics.collectors.vllm.http:read_http"),
)
