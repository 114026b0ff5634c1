"""Real vLLM logs from public threads: every hand-read figure right, no false alarm, no crash.

Each excerpt in ``fixtures/real_vllm/`` is kept exactly as pasted, with a sidecar of hand-read
figures (``figures``, per worker in ``workers``), the failure and its line, the findings a truthful
report must make (``expected_findings``) and those it must not (``forbidden_findings``), and the
source URL. ``README.md`` there indexes them. Sidecar figures that only a hand label or a thread's
text can give (``kv_cache_dtype`` of entry 16, ``gpu_memory_utilization`` read from 22/23's
advisory, ``mamba_cache_blocks``) are not checked against the report, nor is ``num_gpu_blocks_logged``
(entries 42–44: the API server's "num_gpu_blocks is: N" line, which the parser does not read).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, run_cli

CORPUS = FIXTURES / "real_vllm"
LOGS = sorted(CORPUS.glob("*.log"))
GIB = 1 << 30
TOL = GIB // 200 + 1  # printed to 0.01 GiB

# sidecar figure → the worker field of the JSON report
WORKER_FIGURES = {"total_gpu_gib": "total_gpu_bytes", "budget_gib": "requested_bytes",
                  "non_torch_gib": "non_torch_bytes", "activation_peak_gib": "activation_peak_bytes",
                  "available_kv_gib": "available_kv_bytes", "cuda_graph_gib": "cuda_graph_bytes",
                  "cuda_graph_estimate_gib": "cuda_graph_estimate_bytes", "free_gib": "free_at_start_bytes",
                  "requested_gib": "requested_bytes"}


def _sidecar(log: Path) -> dict:
    return json.loads(log.with_suffix(".json").read_text(encoding="utf-8"))


def _report(log: Path) -> dict:
    code, out, err = run_cli(["analyze", str(log), "--json"])
    assert code in (0, 1), "exit {}: {}".format(code, err)
    return json.loads(out, parse_constant=lambda c: pytest.fail("non-strict JSON constant " + c))["targets"][0]


def _near(bytes_: object, gib: float) -> bool:
    return isinstance(bytes_, int) and abs(bytes_ - gib * GIB) <= TOL


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name[:2])
def test_engine_and_outcome(log):
    side, t = _sidecar(log), _report(log)
    assert t["engine"]["name"] == "vllm"
    codes = [f["code"] for f in t["findings"]]
    for code in side["expected_findings"]:
        assert code in codes, (code, codes)
    for code in side["forbidden_findings"]:
        assert code not in codes, (code, codes)
    if side["outcome"] == "failed":
        assert codes[0] == "startup_failed"
        if side["failure"].get("line"):
            assert t["startup"]["failure"]["line"] == side["failure"]["line"]
    else:
        assert codes[0] == "incomplete_startup" if side["outcome"] == "fragment" else "startup_failed" not in codes
        assert t["startup"]["failure"] is None


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name[:2])
def test_figures(log):
    side, t = _sidecar(log), _report(log)
    fig, st = side["figures"], t["startup"]
    ranks = st["ranks"]
    workers = {w["rank"]: w for w in ranks}
    if "weights_gib" in fig:
        assert any(w["weights_bytes"] is not None and abs(w["weights_bytes"] - fig["weights_gib"] * GIB) < GIB / 10**4
                   for w in ranks), fig["weights_gib"]
    for key, field in WORKER_FIGURES.items():
        if key in fig:
            assert any(_near(w[field], fig[key]) for w in ranks), (key, fig[key], [w[field] for w in ranks])
    if "gpu_memory_utilization" in fig and log.name[:2] not in ("22", "23", "12"):
        assert any(w["gpu_memory_utilization"] == fig["gpu_memory_utilization"] for w in ranks)
    for key in ("gpu_blocks", "cpu_blocks", "kv_cache_tokens"):
        if key in fig:
            assert st[key] == fig[key], (key, st[key], fig[key])
    if "max_concurrency" in fig:
        assert st["max_concurrency"] == fig["max_concurrency"]
    for key, value in (fig.get("server_args") or {}).items():  # the 'non-default args:' line (0.10+)
        assert t["engine"]["server_args"].get(key) == value, (key, value, t["engine"]["server_args"])
    if "kv_cache_tokens" in fig:
        assert fig["kv_cache_tokens"] in st["kv_cache_reports"]
    for name, wfig in (fig.get("workers") or {}).items():
        assert name in workers, (name, list(workers))
        for key, field in WORKER_FIGURES.items():
            if key in wfig:
                assert _near(workers[name][field], wfig[key]), (name, key)


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name[:2])
def test_terminal_report_renders(log):
    code, out, err = run_cli(["analyze", str(log)])
    assert code in (0, 1), err
    assert "vLLM" in out


def test_engine_kind_forces_the_parser():
    log = CORPUS / "11_v0-09x-complete-util080-unused.log"
    code, out, err = run_cli(["analyze", str(log), "--json", "--engine-kind", "sglang"])
    assert code == 2 and "no SGLang startup lines" in err
    code, out, err = run_cli(["analyze", str(log), "--json", "--engine-kind", "vllm"])
    assert code in (0, 1) and json.loads(out)["targets"][0]["engine"]["name"] == "vllm"


VLLM_RUNTIME = ("(APIServer pid=441) INFO 11-24 12:00:00 [loggers.py:127] Engine 000: Avg prompt throughput: 1234.5 "
                "tokens/s, Avg generation throughput: 456.7 tokens/s, Running: 12 reqs, Waiting: 0 reqs, "
                "GPU KV cache usage: 3.1%, Prefix cache hit rate: 41.2%\n").encode()


@pytest.mark.parametrize("mib", [3, 20])  # more than the head and tail read; the whole file over 32 MiB
@pytest.mark.parametrize("name", ["11_v0-09x-complete-util080-unused",
                                  "19_v1-012dev-tp1-weights-available-tokens-to-capture"])
def test_a_vllm_startup_deep_inside_runtime_lines_is_found(tmp_path, name, mib):
    """Days of throughput lines before and after the startup: the head and the tail the engine is
    guessed from hold no startup line, so the last startup anchor found in the file decides; the V0
    excerpt begins at profiling, the V1 one at loading."""
    excerpt = (CORPUS / name).with_suffix(".log").read_bytes()
    noise = VLLM_RUNTIME * (mib * (1 << 20) // len(VLLM_RUNTIME))
    log = tmp_path / "days.log"
    log.write_bytes(noise + excerpt + noise)
    alone, report = _report(CORPUS / (name + ".log")), _report(log)
    assert report["engine"]["name"] == "vllm"
    assert [w["available_kv_bytes"] for w in report["startup"]["ranks"]] == \
        [w["available_kv_bytes"] for w in alone["startup"]["ranks"]]
    assert report["startup"]["kv_cache_tokens"] == alone["startup"]["kv_cache_tokens"]


def _finding_ids(report: dict) -> list:
    return [f["code"] for f in report["findings"]]


def test_serving_lines_after_a_startup_show_it_finished(tmp_path):
    """The V1 excerpt stops at graph capture: alone it is a fragment; followed by the API server's
    banner or the stat logger's lines, the server was up, and nothing of the startup is missing."""
    name = "19_v1-012dev-tp1-weights-available-tokens-to-capture.log"
    excerpt = (CORPUS / name).read_bytes()
    assert "incomplete_startup" in _finding_ids(_report(CORPUS / name))
    banner = b"(APIServer pid=1) INFO 11-24 11:44:30 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000\n"
    for tail in (VLLM_RUNTIME * 3, banner):
        log = tmp_path / "served.log"
        log.write_bytes(VLLM_RUNTIME * 2 + excerpt + tail)  # stat lines of an earlier run start no startup
        report = _report(log)
        assert "incomplete_startup" not in _finding_ids(report), tail
        assert report["startup"]["count"] == 1 and report["startup"]["complete"] is True
        assert len(report["startup"]["ranks"]) == 1
        assert report["startup"]["ranks"][0]["available_kv_bytes"] == round(33.31 * GIB)


@pytest.mark.parametrize("prefix, tag", [
    ("(VllmWorker TP1 pid=3975) ", "VllmWorker TP1 pid=3975"),
    ("(VllmWorker PP1_TP0 pid=7) ", "VllmWorker PP1_TP0 pid=7"),
    ("(VllmWorker PP1 pid=7) ", "VllmWorker PP1 pid=7"),
    ("(VllmWorker pid=7) ", "VllmWorker pid=7"),
    ("(Worker_TP0 pid=26347) ", "Worker_TP0 pid=26347"),
])
def test_vllm_010_multiproc_worker_prefix_is_a_worker(prefix, tag):
    """vLLM 0.10.x's V1 multiproc workers print "(VllmWorker TP0 pid=N)", a blank inside the name
    (entry 43): each is its own worker, not a record without a process."""
    from kvforensics.collectors.vllm.log import parse_line, split_record
    line = prefix + "INFO 09-03 02:12:25 [gpu_worker.py:276] Available KV cache memory: 31.83 GiB"
    assert split_record(line)[1] == tag
    (ev,) = parse_line(line, 1)
    assert ev.rank == tag and ev.kind == "available_kv"


def test_a_hard_wrapped_args_dict_is_joined_back(tmp_path):
    """A console copy wrapped at a fixed width (entries 42, 43) cuts 'non-default args: {…}' anywhere,
    here inside values: the header-less lines right after it are its rest. A dict tail that follows
    another line (the sampling-params line) or comes after a gap is not the args line's, and a value
    cut at the end of what was found is left unknown, not read as its first digits."""
    excerpt = (CORPUS / "42_v1-01011-tp1-complete-a100-util050-hard-wrapped.log").read_text().splitlines(True)
    head = ("(APIServer pid=9) INFO 09-04 01:28:28 [utils.py:326] non-default args: {'model': 'm', 'gpu_memory_"
            "utilization': 0.3, 'max_model_len': 81\n92, 'tensor_parallel_size': 1, 'port': 80\n81}\n")
    log = tmp_path / "wrapped.log"
    log.write_text(head + "".join(excerpt[4:]))
    args = _report(log)["engine"]["server_args"]
    assert args == {"gpu_memory_utilization": 0.3, "max_model_len": 8192, "tensor_parallel_size": 1}
    gap = head.replace("\n92", "\nINFO 09-04 01:28:28 [x.py:1] -\n92")
    log.write_text(gap + "".join(excerpt[4:]))
    assert _report(log)["engine"]["server_args"] == {"gpu_memory_utilization": 0.3}


def test_every_sidecar_figure_is_printed_in_its_log(tmp_path):
    from tests.fixtures.real_vllm import check_corpus

    assert check_corpus.mismatches() == []
    # and the check sees a sidecar that misquotes its log, or points its failure at the wrong line
    name = "08_v0-07x-tp2-maxlen-too-large-error-first"
    doc = json.loads((CORPUS / (name + ".json")).read_text())
    doc["figures"]["gpu_blocks_typo"] = 123457
    doc["failure"]["line"] = 2
    (tmp_path / (name + ".json")).write_text(json.dumps(doc))
    (tmp_path / (name + ".log")).write_text((CORPUS / (name + ".log")).read_text())
    assert [p.split(": ", 1)[1] for p in check_corpus.mismatches(tmp_path)] == [
        "figures.gpu_blocks_typo = 123457 is not printed in the log",
        "failure.line 2 does not hold the failure message"]
