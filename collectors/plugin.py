"""What the collectors need to know of an engine: one descriptor per engine, one registry.

Each engine's folder (``collectors/<name>/plugin.py``) exports ``ENGINE = EngineCollectors(...)``.
The engine-neutral collectors (the log reader, the /proc scan, the HTTP reader, the log finder)
read engines only through this registry, never by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

from kvforensics.collectors.registry import Registry, UnknownEngine

if TYPE_CHECKING:  # annotations only: a host whose processes are no engine's never imports the log's records
    from kvforensics.collectors.events import EngineStartup, LogEvent

__all__ = ["EngineCollectors", "ENGINES", "UnknownEngine", "display", "for_bundle"]

Rows = Tuple[Tuple[Optional[int], int, str], ...]


class EngineCollectors(NamedTuple):
    """One engine, as the probe's collectors see it.

    A NamedTuple, not a frozen dataclass: as immutable, but every host's probe builds it, and dataclasses
    (with the inspect, ast and dis it imports) cost each host ~10 ms of CPU where this costs ~0.3 ms."""

    name: str  # the registry key, written into snapshots, bundles and JSON ("kind")
    display: str  # how people write it
    # --- its log ---
    formats: Tuple[Any, ...]  # collectors.lineformat rows of lines that carry startup facts
    idle_needles: Tuple[str, ...]  # substrings of its serving lines (a startup's end; parsed only then)
    parse_line: Callable[[str, Optional[int], int], List[LogEvent]]
    segmenter: Callable[..., Any]  # StartupSegmenter(keep=…): feed(event), result(), current_closed
    segment_lines: Callable[[Any], List[EngineStartup]]
    anchors: Tuple[bytes, ...]  # lines a startup prints, searched backward to place the reading window
    anchors_in_order: bool  # True: the first anchor found wins (fallbacks); False: the last of any
    anchor_words: str  # the anchor, as a note names it
    end_words: str  # the line that ends a startup, as a note names it
    no_startup_hint: str  # what was looked for, for "no startup lines found"
    launch_lines: Tuple[bytes, ...]  # the line each launch opens with (a journal read newest first stops there)
    owns_event: Callable[[LogEvent], bool]  # a generic line (traceback) that still carries its own prefix
    begins_cleanly: Callable[[EngineStartup, int, int], bool]  # first startup of a window not cut by its edge
    # --- its processes ---
    classify: Callable[[List[str]], Optional[Dict[str, Any]]]  # command line → role, or None
    parse_flags: Callable[[List[str]], Dict[str, Any]]
    default_port: int
    # --- its HTTP ---
    read_http: Callable[[str, Dict[str, Any]], bool]  # fill engine_http's section from the base URL
    legacy_default: bool = False  # the engine of bundles written before snapshots named one
    # Where its records begin in raw bytes (buf, start, end → offsets), for an engine that glues records
    # into one physical line: the reader cuts a line longer than it should parse whole there.
    record_starts: Optional[Callable[[bytes, int, int], Iterator[int]]] = None
    # Settings in files its command line names: (root, pid, uid, flags) → (more flags, notes), read on the host
    # (TensorRT-LLM's --extra_llm_api_options YAML, Triton's config.pbtxt); they override the command line's.
    config_flags: Optional[Callable[[str, int, Optional[int], Dict[str, Any]], Tuple[Dict[str, Any], List[str]]]] \
        = None


ENGINES: "Registry[EngineCollectors]" = Registry("kvforensics.collectors")


def display(name: Optional[str]) -> str:
    engine = ENGINES.find(name)
    return engine.display if engine is not None else "?"


def for_bundle(kind: Any) -> EngineCollectors:
    """The engine a snapshot's engine entry names; an entry from before kinds were written is the
    legacy engine's (the only one there was)."""
    engine = ENGINES.find(kind)
    if engine is not None:
        return engine
    return next((e for e in ENGINES.all() if e.legacy_default), ENGINES.first())
