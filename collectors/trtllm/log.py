"""Recognise TensorRT-LLM log lines and turn them into events (pure: text in, events out).

TensorRT-LLM writes through two loggers, and a log holds both:

* the C++ runtime's ``[TensorRT-LLM][INFO] message`` (``TLLM_LOG_*``: levels ``TRACE``, ``DEBUG``,
  ``INFO``, ``WARNING``, ``ERROR``). It prints no rank: at TP > 1 every rank prints the same line, so
  the same line N times is N ranks, never N allocations. Its event rank is ``""``.
* the Python package's ``[TRT-LLM] [I] message``, with ``[RANK n] `` after ``[TRT-LLM] `` where the
  process knows its MPI rank (the PyTorch backend's workers), behind a ``[MM/DD/YYYY-HH:MM:SS] ``
  timestamp (tensorrt_llm/logger.py; levels I, W, E, V, D, F). Its event rank is ``"RANK n"`` or ``""``.

Around them: the package banner ``[TensorRT-LLM] TensorRT-LLM version: X`` (one per process),
TensorRT's own ``[TRT] [I] …``, AutoDeploy's ``[AutoDeploy]`` tag after the level, Triton's glog header
(``I0412 10:22:33.123456 1234 file.cc:123] ``) and mpirun's ``--tag-output`` (``[1,0]<stdout>:``).
A line with none of them (a Python traceback, uvicorn's ``INFO:     Application startup complete.``)
has rank ``None``; the failure and ready rows still read it.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

from kvforensics.collectors import lineformat
from kvforensics.collectors.events import LogEvent
from kvforensics.collectors.trtllm.formats import FORMATS

__all__ = ["LogEvent", "parse_line", "split_record"]

_ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;?]*[ -/]*[@-~]")
# Wrappers before the record, any order, each at most once in practice: mpirun's tag, Triton's glog header,
# a pasted quote or bullet, a Kubernetes viewer's "pod/container | ".
_OUTER = re.compile(
    r"^(?:\[\d{1,5},\d{1,5}\]<(?:stdout|stderr)>: ?"
    r"|[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+ +\d+ [\w.+-]+:\d+\] "
    r"|> |- |\d{4}-\d{2}-\d{2}[ T][\d:.,]+ \| [^|]* \| )+")
_STAMP = r"\[(?P<ts>\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2})\] "
# C++, 2023 to 2026: "[TensorRT-LLM][INFO] " and, from a rank-aware call, "[TensorRT-LLM][INFO][3] " (a bare
# integer); a timestamped build prints "<MM-DD-YYYY HH:MM:SS.uuuuuu> [TRT-LLM] [I] [3] " (cpp/include/tensorrt_llm/
# common/logger.h).
_CPP = re.compile(r"^(?:" + _STAMP + r")?\[?TensorRT-LLM\]\[(?P<level>TRACE|DEBUG|INFO|WARNING|ERROR|VERBOSE)\]"
                  r"(?:\[(?P<rank>\d{1,6})\]| ?\[RANK (?P<rank2>\d{1,6})\])? ?")
# Python (tensorrt_llm/logger.py): "[TRT-LLM] [MPI_Rank 1] [I] " (2023), "[TRT-LLM] [I] ", "[TRT-LLM] [RANK 0] [I] "
# (2025), and from 2026 the module after the level, the rank after it: "[TRT-LLM] [I] [_torch] [RANK 0] ", then
# without padding or spaces, "[TRT-LLM] [I] [batchmgr][RANK 0] " (the C++ runtime's lines, routed through the same
# format). AutoDeploy's logger prints "[TRT-LLM AUTO-DEPLOY]".
_MODULES = r"batchmgr|_torch|llmapi|serve|runtime|quantize|executor|common|kernels|models|layers|bench|commands" \
    r"|metrics|disagg|tools|plugin|AutoDeploy|auto_deploy"
_PY = re.compile(r"^(?:" + _STAMP + r"|\d{2}-\d{2}-\d{4} [\d:.]{8,16} )?\[TRT-LLM(?P<ad> AUTO-DEPLOY)?\] "
                 r"(?:\[(?:RANK|MPI_Rank) (?P<rank>\d{1,6})\] )?\[(?P<level>[IWEVDF])\] ?"
                 r"(?:\[(?P<part>" + _MODULES + r") *\])? ?(?:\[(?:RANK )?(?P<rank2>\d{1,6})\])? ?")
_BANNER = re.compile(r"^\[TensorRT-LLM\] (?=TensorRT[- ]LLM version)")
_TRT = re.compile(r"^(?:" + _STAMP + r")?\[TRT\] \[(?P<level>[IWEVF])\] ")

Split = Tuple[Optional[str], Optional[str], str, str, str, str]


def split_record(raw: str) -> Split:
    """``(ts, rank, logger, level, module, message)`` of one physical line (module: 2026's tag after the level).
    logger: "cpp" (also 1.3's ``[batchmgr]``),
    "py", "autodeploy", "banner", "trt" or "" (no TensorRT-LLM prefix: rank None)."""
    text = _ANSI.sub("", raw).replace("\r", "").strip()
    text = _OUTER.sub("", text, count=1)
    for logger, pattern in (("cpp", _CPP), ("py", _PY), ("trt", _TRT)):
        m = pattern.match(text)
        if m is not None:
            groups = m.groupdict()
            rank = groups.get("rank") or groups.get("rank2")
            part = (groups.get("part") or "").strip()
            if part == "batchmgr":
                logger = "cpp"
            elif part in ("AutoDeploy", "auto_deploy") or groups.get("ad"):
                logger = "autodeploy"
            return (m.group("ts"), "RANK " + rank if rank else "", logger, m.group("level"), part or "",
                    text[m.end():].strip())
    m = _BANNER.match(text)
    if m is not None:
        return None, "", "banner", "", "", text[m.end():].strip()
    return None, None, "", "", "", text


def parse_line(raw: str, line: Optional[int] = None, offset: int = 0) -> List[LogEvent]:
    ts, rank, logger, level, module, msg = split_record(raw)
    if not msg:
        return []
    found = lineformat.match(FORMATS, msg)
    if found is None:
        return []
    row, data = found
    data = dict(data)
    data["logger"] = logger
    if level:
        data["level"] = level
    if module:
        data["module"] = module
    text = msg if len(msg) <= 240 else msg[:237] + "..."
    return [LogEvent(kind=row.kind, line=line, offset=offset, rank=rank, ts=ts, data=data, text=text, raw=raw,
                     fmt=row.name)]
