"""Units, one place: bytes inside, GiB only on screen (labelled).

Standard library only (shipped with the probe).
"""

from __future__ import annotations

from typing import Optional

GIB = 1 << 30  # what SGLang and vLLM print as "GB" for GPU memory (torch: bytes / 2**30)
MIB = 1 << 20
GB = 10**9  # decimal GB: SGLang's HiCache host sizes, --hicache-size


def gib(n: Optional[float]) -> str:
    """'12.34 GiB', or '—' for an unknown figure (as everywhere on screen; never 0)."""
    return "—" if n is None else "{:.2f} GiB".format(n / GIB)


def gib_number(n: Optional[float]) -> str:
    """'12.34' (the column says GiB), or '—' for an unknown figure."""
    return "—" if n is None else "{:.2f}".format(n / GIB)
