"""TensorRT-LLM's own HTTP view (filled in below)."""

from __future__ import annotations

from typing import Any, Dict


def read_http(base: str, section: Dict[str, Any]) -> bool:
    return False
