"""``analyze --format oneline``: one tab-separated line per log, under the header of inspect's oneline
(``reports/terminal.py`` ``render_oneline``), so one awk script reads both.

A log has no host and no NVML: the first column is the log as given (``-`` for stdin), GPUs are the
ranks (or workers) the startup shows, and "unused" is the ``unused_gpu_memory`` finding when the log
alone can tell it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from kvforensics.agent.model.severity import severity_rank
from kvforensics.agent.plugin import display
from kvforensics.reports.terminal import ONELINE_HEADER, oneline_row


def render_analyses(analyses: Sequence[Any]) -> str:
    """The header, then one line per analysed startup."""
    return "\n".join(["\t".join(ONELINE_HEADER)] + ["\t".join(_cell(c) for c in analysis_row(a))
                                                    for a in analyses]) + "\n"


def analysis_row(a: Any) -> Tuple[str, ...]:
    """The oneline columns (reports/terminal.py ONELINE_HEADER) of one startup."""
    engine = "{} {}".format(display(a.engine, "?"), a.era.hint or "").strip()
    unused = next((f.bytes for f in a.findings if f.code == "unused_gpu_memory"), None)
    worst = max(a.findings, key=lambda f: severity_rank(f.severity), default=None)
    return oneline_row(a.target.split(":", 1)[-1], a.status, len(a.ranks) or None, engine, _model(a),
                       a.summary.max_total_num_tokens, unused, worst)


def _model(a: Any) -> Optional[str]:
    model = a.server_args.get("model_path") or a.server_args.get("model")
    return str(model).rstrip("/").rsplit("/", 1)[-1] if model else None


def _cell(text: str) -> str:
    # A tab or newline inside a cell (a model path, a log name) would split the line for awk.
    return " ".join(str(text).split()) or "—"
