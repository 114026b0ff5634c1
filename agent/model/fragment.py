"""A startup log that stops before its engine finished starting: how far it got and what it cannot show, the one
finding every engine whose startup runs in named stages makes of it (``incomplete_startup``)."""

from __future__ import annotations

from typing import Dict, Optional, Sequence

from kvforensics.agent.model.citing import where
from kvforensics.agent.model.records import Finding
from kvforensics.collectors.events import LogEvent


def incomplete_startup(stages: Sequence[str], words: Dict[str, str], seen: Sequence[str],
                       last_event: Optional[LogEvent], end: str, detail: str, action: str) -> Finding:
    """``stages``: the engine's stages in order, ``words`` how each is said, ``seen`` those the log shows (the last
    at ``last_event``); ``end``: what finishing is ("the startup finished"); ``detail`` and ``action``: what follows
    the fragment in this engine, and what to paste."""
    last = seen[-1] if seen else None
    if last_event is None:
        title = "The log shows no startup stage: it is a fragment"
    else:
        title = "The log stops before {}: the last stage it shows is {} ({})".format(end, words[seen[-1]],
                                                                                   where(last_event))
    missing = [words[x] for x in stages[stages.index(last) + 1 if last else 0:]]
    return Finding(code="incomplete_startup", severity="info", title=title, detail=detail, bytes=None,
                   evidence=(where(last_event),) if last_event is not None else (),
                   proof="{}not shown: {}".format("last stage {} ({}); ".format(words[last], where(last_event))
                                                  if last and last_event is not None else "", ", ".join(missing)),
                   action=action)
