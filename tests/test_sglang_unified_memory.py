"""Unified-memory GPUs (GB10 / DGX Spark): NVML reports no framebuffer figures, and SGLang's "free GPU
memory" is the host's available RAM (get_available_gpu_memory: psutil.virtual_memory().available when
props.is_integrated, utils/common.py, sglang 0.5.18). A --mem-fraction-static raise takes host memory:
it is advised only with what the host keeps."""

from __future__ import annotations

from types import SimpleNamespace

from kvforensics.agent.model.records import Recommendation
from kvforensics.agent.sglang import recommend

GIB = 1 << 30


def _gpu(index: int, total, free, status: str = "partial"):
    return SimpleNamespace(index=index, status=status, total_bytes=total, free_bytes=free)


def _ctx(gpus, available):
    live = SimpleNamespace(engine_gpus=tuple(gpus), gpus=tuple(gpus),
                           host_memory=SimpleNamespace(available_bytes=available))
    return SimpleNamespace(live=live, analysis=None)


def _raise(monkeypatch, ctx):
    rec = Recommendation(flag="--mem-fraction-static", value="0.9", gain_bytes=10 * GIB, gain_tokens=1000,
                         basis="estimated", rationale="r.", gain_requests={}, fixes="unused_gpu_memory")
    change = SimpleNamespace(gain_bytes=10 * GIB)
    found = SimpleNamespace(spare_bytes=12 * GIB, worth_it=True, change=change, cut_advised=False)
    monkeypatch.setattr(recommend, "spare_memory", lambda c: found)
    monkeypatch.setattr(recommend, "_measured_raise", lambda c, a, f: rec)
    monkeypatch.setattr(recommend, "Analysis", SimpleNamespace)
    ctx.analysis = SimpleNamespace(failed=None)
    return list(recommend.mem_fraction(ctx))


def test_discrete_gpu_is_not_unified():
    assert recommend.unified_memory_gpu(_ctx([_gpu(0, 80 * GIB, 5 * GIB, "ok")], 100 * GIB)) is None
    assert recommend.unified_memory_gpu(SimpleNamespace(live=None)) is None
    # One discrete GPU whose memory query failed beside others that answer is a fault, not unified memory.
    faulty = [_gpu(0, 80 * GIB, 5 * GIB), _gpu(1, None, None), _gpu(2, 80 * GIB, 5 * GIB)]
    assert recommend.unified_memory_gpu(_ctx(faulty, 100 * GIB)) is None


def test_raise_on_unified_memory_says_what_the_host_keeps(monkeypatch):
    recs = _raise(monkeypatch, _ctx([_gpu(0, None, None)], 30 * GIB))
    assert len(recs) == 1
    text = recs[0].rationale
    assert "takes 10.00 GiB from the host, which keeps 20.00 GiB available of 30.00 GiB now" in text, text


def test_no_raise_on_unified_memory_without_host_figures(monkeypatch):
    assert _raise(monkeypatch, _ctx([_gpu(0, None, None)], None)) == []


def test_discrete_raise_is_unchanged(monkeypatch):
    recs = _raise(monkeypatch, _ctx([_gpu(0, 80 * GIB, 20 * GIB, "ok")], 30 * GIB))
    assert [r.rationale for r in recs] == ["r."]
