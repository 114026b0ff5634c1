"""The severities of findings, least to most severe, and their order.

Its own module, without the records: the command line checks ``--fail-on`` before the first ssh starts, and the
records (two dozen dataclasses) are imported while the handshake runs, not before it."""

from __future__ import annotations

SEVERITIES = ("info", "warning", "error", "critical")


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)


def most_severe_first(findings):  # type: ignore[no-untyped-def]
    """Findings sorted critical → info (stable within a severity)."""
    return sorted(findings, key=lambda f: -severity_rank(f.severity))
