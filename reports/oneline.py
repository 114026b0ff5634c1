"""``analyze --format oneline``: one tab-separated line per log, under the header of inspect's oneline
(``reports/terminal.py`` ``render_oneline``), so one awk script reads both.

A log has no host and no NVML: the first column is the log as given (``-`` for stdin), GPUs are the
ranks (or workers) the startup shows, and "unused" is the ``unused_gpu_memory`` finding when the log
alone can tell it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from agent.model.records import severity_rank
from agent.plugin import display
from reports.terminal import FLEET_COLUMNS, gib_cell


def render_analyses(analyses: Sequence[Any]) -> str:
    """The header, then one line per analysed startup."""
    header = "\t".join(col.header for col in FLEET_COLUMNS)
    return "\n".join([header] + ["\t".join(_cell(c) for c in analysis_row(a)) for a in analyses]) + "\n"


def analysis_row(a: Any) -> Tuple[str, ...]:
    """(log, status, GPUs, engine, model, KV tokens, unused GiB, worst finding) of one startup."""
    engine = "{} {}".format(display(a.engine, "?"), a.era.hint or "").strip()
    tokens = a.summary.max_total_num_tokens
    unused = next((f.bytes for f in a.findings if f.code == "unused_gpu_memory"), None)
    worst = max(a.findings, key=lambda f: severity_rank(f.severity), default=None)
    return (a.target.split(":", 1)[-1], a.status, str(len(a.ranks)) if a.ranks else "—", engine,
            _model(a) or "—", "{:,}".format(tokens) if tokens else "—", gib_cell(unused) if unused else "—",
            "{} {}".format(worst.severity, worst.code) if worst else "—")


def _model(a: Any) -> Optional[str]:
    model = a.server_args.get("model_path") or a.server_args.get("model")
    return str(model).rstrip("/").rsplit("/", 1)[-1] if model else None


def _cell(text: str) -> str:
    # A tab or newline inside a cell (a model path, a log name) would split the line for awk.
    return " ".join(str(text).split()) or "—"
