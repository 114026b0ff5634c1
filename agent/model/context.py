"""What a rule sees: the startup's analysis, and on a live node the reconciled ledger and its history.

Its own module so that the rule book, the node rules and each engine's rules and recommenders
all read it without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from kvforensics.agent.model.records import Options

if TYPE_CHECKING:  # a pasted log's context has no live node: its records stay unloaded
    from kvforensics.agent.model.live import Inspection


@dataclass(frozen=True)
class Context:
    """What the rules see. ``analysis`` is None when no startup log could be read."""

    analysis: Optional[Any]  # an engine's analysis (agent/plugin.py EngineAnalysis)
    options: Options
    live: Optional[Inspection] = None

    @classmethod
    def offline(cls, analysis: Any) -> "Context":
        return cls(analysis, analysis.options)

    @classmethod
    def on_node(cls, insp: Inspection) -> "Context":
        return cls(insp.analysis, insp.options, insp)

    @property
    def history(self) -> Optional[object]:
        return self.live.history if self.live is not None else None

    @property
    def engine_kind(self) -> Optional[str]:
        """The engine explained: the live node's, else the log's; None when neither is known."""
        if self.live is not None and self.live.engine_kind:
            return self.live.engine_kind
        return getattr(self.analysis, "engine", None)
