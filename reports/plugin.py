"""What the renderers need to know of an engine: one descriptor per engine, one registry.

The engine-neutral renderers draw the verdict, the GPUs, findings and recommendations from typed
fields every engine has; what only one engine's analysis holds (SGLang's per-rank ledger, vLLM's
per-worker table) is drawn by its own view, ``reports/<engine>/plugin.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from kvforensics.collectors.registry import Registry

__all__ = ["EngineView", "VIEWS"]


@dataclass(frozen=True)
class EngineView:
    """One engine's own parts of the report."""

    name: str  # the same key as its collectors' and model's plug-ins
    terminal: Callable[[Any, Any], None]  # (rich console, analysis): the startup's evidence
    json_target: Callable[[Any], Dict[str, Any]]  # analysis → the report's target object
    # analysis → Markdown lines of the evidence; None: the terminal view drawn without colour
    markdown: Optional[Callable[[Any], List[str]]] = None
    # live inspection → (rank label, KV pool bytes) for the exporter's per-rank series
    kv_pool_by_rank: Callable[[Any], Iterable[Tuple[str, int]]] = lambda insp: ()
    # analysis → the startup in a sentence or two of plain text, for the one-screen report (release,
    # model, parallelism, KV tokens, what bounds concurrency); wrapped by the caller, never cut
    brief: Callable[[Any], List[str]] = lambda analysis: []


VIEWS: "Registry[EngineView]" = Registry("kvforensics.reports")
