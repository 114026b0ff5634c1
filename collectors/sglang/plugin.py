"""SGLang, as the collectors see it: the one object the engine-neutral code reads.

Nothing of the engine is imported with it: its parts are ``lazy``, imported on first call. The probe scans
/proc with every engine's command-line rules (``processes``) on every host and reads a log only for an engine
it found; ``analyze`` reads a log and never a process table; the log's parts (formats: dozens of regexes,
compiled from source on the host) are loaded by what reads a log.
"""

from __future__ import annotations

from kvforensics.collectors.plugin import EngineCollectors
from kvforensics.collectors.registry import lazy, lazy_rows

# Every startup since 0.2.15 prints it, once per rank and runner. The longer the needle, the
# longer the skips of the reverse search: 29 bytes scan 2 GiB in 0.13 s, 17 bytes in 0.24 s.
ANCHOR = b"Load weight begin. avail mem="

ENGINE = EngineCollectors(
    name="sglang",
    display="SGLang",
    formats=lazy_rows("kvforensics.collectors.sglang.formats:FORMATS"),
    idle_needles=(),
    parse_line=lazy("kvforensics.collectors.sglang.log:parse_line"),
    segmenter=lazy("kvforensics.collectors.sglang.startups:StartupSegmenter"),
    segment_lines=lazy("kvforensics.collectors.sglang.startups:segment_lines"),
    # The last load line, else (a startup that never loaded) the last server_args.
    anchors=(ANCHOR, b"server_args="),
    anchors_in_order=True,
    anchor_words="'Load weight begin'",
    end_words="its summary line",
    no_startup_hint="'Load weight', 'KV Cache is allocated', 'max_total_num_tokens='",
    launch_lines=(b"server_args=",),
    owns_event=lazy("kvforensics.collectors.sglang.startups:owns_event"),
    begins_cleanly=lazy("kvforensics.collectors.sglang.startups:begins_cleanly"),
    classify=lazy("kvforensics.collectors.sglang.processes:classify"),
    parse_flags=lazy("kvforensics.collectors.sglang.processes:parse_flags"),
    default_port=30000,  # server_args.py ServerArgs.port
    read_http=lazy("kvforensics.collectors.sglang.http:read_http"),
    legacy_default=True,  # kvforensics explained SGLang alone before snapshots named the engine
    record_starts=lazy("kvforensics.collectors.sglang.log:record_starts"),
    # records glued to tqdm bars, or to each other
)
