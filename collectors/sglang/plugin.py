"""SGLang, as the collectors see it: the one object the engine-neutral code reads.

Only ``processes`` (which command lines are SGLang's) is imported with it: the probe scans /proc with
every engine's descriptor on every host, and reads a log only for an engine it found. The log's parts
(formats: dozens of regexes, compiled from source on the host) are ``lazy``, imported on first call.
"""

from __future__ import annotations

from collectors.plugin import EngineCollectors
from collectors.registry import lazy, lazy_rows
from collectors.sglang import processes

# Every startup since 0.2.15 prints it, once per rank and runner. The longer the needle, the
# longer the skips of the reverse search: 29 bytes scan 2 GiB in 0.13 s, 17 bytes in 0.24 s.
ANCHOR = b"Load weight begin. avail mem="

ENGINE = EngineCollectors(
    name="sglang",
    display="SGLang",
    formats=lazy_rows("collectors.sglang.formats:FORMATS"),
    idle_needles=(),
    parse_line=lazy("collectors.sglang.log:parse_line"),
    segmenter=lazy("collectors.sglang.startups:StartupSegmenter"),
    segment_lines=lazy("collectors.sglang.startups:segment_lines"),
    # The last load line, else (a startup that never loaded) the last server_args.
    anchors=(ANCHOR, b"server_args="),
    anchors_in_order=True,
    anchor_words="'Load weight begin'",
    end_words="its summary line",
    no_startup_hint="'Load weight', 'KV Cache is allocated', 'max_total_num_tokens='",
    launch_lines=(b"server_args=",),
    owns_event=lazy("collectors.sglang.startups:owns_event"),
    begins_cleanly=lazy("collectors.sglang.startups:begins_cleanly"),
    classify=processes.classify,
    parse_flags=processes.parse_flags,
    default_port=processes.DEFAULT_PORT,
    read_http=lazy("collectors.sglang.http:read_http"),
    legacy_default=True,  # kvforensics explained SGLang alone before snapshots named the engine
    record_starts=lazy("collectors.sglang.log:record_starts"),  # records glued to tqdm bars, or to each other
)
