"""Hostile bundles (``inspect --from``): every crash a fuzz campaign found, each pinned; a bundle's memory
while it is read; and a seeded mutation campaign over the shipped bundles (examples/seed-node.json,
examples/vllm-node.json).

A forged bundle is refused (exit 2, one line) or inspected (exit 0, 1 or 3); never an internal error
(exit 4), and ``--json`` is strict JSON valid against the report schema (run_cli checks it).
``KVF_FUZZ_SEED=S KVF_FUZZ_CASES=N`` runs another or a bigger campaign by hand.
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest

from kvforensics.agent.model import evidence
from kvforensics.agent.remote import bundles
from tests.conftest import EACH_FORMAT, ROOT, run_cli, run_in_each_format
from tests.test_fuzz_logs import mutate as mutate_log
from tests.test_log_memory import PEAK

SEED = json.loads((ROOT / "examples" / "seed-node.json").read_text(encoding="utf-8"))
VLLM = json.loads((ROOT / "examples" / "vllm-node.json").read_text(encoding="utf-8"))
FORMATS = EACH_FORMAT


def _inspect_everywhere(path: Path, formats=FORMATS) -> List[int]:
    return run_in_each_format(["inspect", "--from", str(path)], formats, (0, 1, 2, 3))


def _write(tmp_path: Path, doc: Dict[str, Any], name: str = "bundle.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _target(path: Path) -> Dict[str, Any]:
    code, out, err = run_cli(["inspect", "--from", str(path), "--json"])
    assert code in (0, 1, 3), err
    return json.loads(out)["targets"][0]


def _codes(target: Dict[str, Any]) -> List[str]:
    return [p["code"] for p in target["problems"]]


# --- the crash sites a campaign found --------------------------------------------------------

def test_a_text_max_model_len_is_an_unknown_flag_not_a_number_format_crash(tmp_path):
    # The log prints no arguments, so the bundle's flags are used: the terminal formatted "4096" with {:,}.
    doc = copy.deepcopy(VLLM)
    doc["engines"]["engines"][0]["server_args"]["max_model_len"] = "4096"
    doc["engine_log"]["lines"] = [row for row in doc["engine_log"]["lines"]
                                  if "non-default args" not in row[2] and "Initializing" not in row[2]]
    path = _write(tmp_path, doc)
    assert _inspect_everywhere(path) == [1, 1, 1, 1]
    t = _target(path)
    assert "server_args.invalid" in _codes(t) and t["startup"]["max_model_len"] != "4096"


@pytest.mark.parametrize("key,value", [("page_size", "16"), ("tp_size", 10**30), ("mem_fraction_static", 1e300),
                                       ("max_running_requests", [64]), ("speculative_num_steps", {"a": 1}),
                                       ("model_path", 12), ("enable_dp_attention", "yes")])
def test_a_forged_sglang_flag_is_unknown_with_a_problem(tmp_path, key, value):
    doc = copy.deepcopy(SEED)
    doc["engines"]["engines"][0]["server_args"][key] = value
    doc["engine_log"]["lines"] = [row for row in doc["engine_log"]["lines"] if "server_args=" not in row[2]]
    path = _write(tmp_path, doc)
    _inspect_everywhere(path)
    assert "server_args.invalid" in _codes(_target(path))


def test_a_log_flag_that_fails_its_type_gives_way_to_the_command_line_and_says_so(tmp_path):
    doc = copy.deepcopy(SEED)
    doc["engine_log"]["lines"] = [[r[0], r[1], r[2].replace("mem_fraction_static=0.88", "mem_fraction_static=7")]
                                  for r in doc["engine_log"]["lines"]]
    path = _write(tmp_path, doc)
    _inspect_everywhere(path)
    t = _target(path)
    budget = t["startup"]["budget"]
    assert budget["mem_fraction_static"] == 0.88 and "command line" in budget["mem_fraction_static_source"]
    assert "server_args.invalid" in _codes(t)


@pytest.mark.parametrize("status", ["failed", "absent"])
def test_a_gpu_status_the_report_cannot_hold_is_refused_at_the_edge(tmp_path, status):
    # The report's gpus[].status is ok/partial/lost (what the collector writes); the snapshot schema once
    # allowed every section status, so --json printed a document its own schema refuses.
    doc = copy.deepcopy(SEED)
    doc["nvml"]["gpus"][3]["status"] = status
    code, out, err = run_cli(["inspect", "--from", str(_write(tmp_path, doc)), "--json"])
    assert code == 2 and "nvml/gpus/3/status" in err and len(err.strip().splitlines()) == 1


def test_lines_of_another_engine_than_the_log_claims_are_a_problem_not_a_silent_null(tmp_path):
    doc = copy.deepcopy(VLLM)
    doc["engine_log"] = copy.deepcopy(SEED["engine_log"])
    doc["engine_log"]["engine"] = "vllm"
    path = _write(tmp_path, doc)
    _inspect_everywhere(path)
    t = _target(path)
    assert t["startup"] is None and t["engine"]["name"] == "vllm"  # valid against the schema (run_cli)
    assert "engine_log.no_startup" in _codes(t)


def test_an_engine_entry_of_another_kind_than_the_log_is_a_one_line_problem(tmp_path):
    doc = copy.deepcopy(VLLM)
    doc["engines"]["engines"][0]["kind"] = "sglang"
    path = _write(tmp_path, doc)
    assert set(_inspect_everywhere(path)) <= {0, 1}
    t = _target(path)
    assert "engine_log.other_engine" in _codes(t) and t["startup"] is None


@pytest.mark.parametrize("doc", [SEED, VLLM], ids=["sglang", "vllm"])
def test_a_bundle_with_lines_but_no_engine_entry_is_analysed(tmp_path, doc):
    doc = copy.deepcopy(doc)
    doc["engines"]["engines"] = []
    path = _write(tmp_path, doc)
    assert set(_inspect_everywhere(path)) <= {0, 1}
    assert _target(path)["startup"] is not None


def test_an_analysis_without_an_engine_name_is_no_match_not_a_crash(tmp_path, monkeypatch):
    # A plug-in's analysis that names no engine (the protocol asks for one) is not the server's engine's.
    from dataclasses import dataclass

    from kvforensics.agent.model import reconcile

    real = reconcile.analyze_startup

    def unnamed(*args, **kwargs):  # type: ignore[no-untyped-def]
        a = real(*args, **kwargs)

        @dataclass(frozen=True)
        class Unnamed:
            inner: Any

            def __getattr__(self, name: str) -> Any:
                if name == "engine":
                    raise AttributeError(name)
                return getattr(self.inner, name)

        return Unnamed(a)

    monkeypatch.setattr(reconcile, "analyze_startup", unnamed)
    insp = reconcile.reconcile(evidence.parse(copy.deepcopy(SEED)), "bundle:x", _options())
    assert insp.analysis is None
    assert any(p.code == "engine_log.other_engine" and "unnamed engine" in p.message for p in insp.problems)


def _options() -> Any:
    from kvforensics.agent.model.records import Options

    return Options()


# --- memory while a bundle is read --------------------------------------------------------

def test_a_bundle_over_the_cap_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(bundles.MAX_BUNDLE_BYTES + 1)
    code, _, err = run_cli(["inspect", "--from", str(path)])
    assert code == 2 and "larger than 64 MiB" in err


@pytest.mark.parametrize("filler", ["{},", "[],", '"ab",', "1.5,", '{"a":[]},'])
def test_a_bundle_of_tiny_values_is_refused_by_its_shape(filler):
    # Each of these would take 8–24× its text as objects; real bundles take 2–3×.
    body = filler * ((2 << 20) // len(filler))
    text = '{"schema": "kvforensics.snapshot/1", "nvml": {"gpus": [' + body + '{}]}}'
    with pytest.raises(evidence.EvidenceError, match="tiny values"):
        evidence.loads(text)


def test_a_large_real_shaped_bundle_passes_the_shape_check():
    doc = copy.deepcopy(SEED)
    doc["engine_log"]["lines"] = doc["engine_log"]["lines"] * 100  # ~2 MiB of log lines
    text = json.dumps(doc, indent=1)
    assert len(text) > evidence.SHAPE_FREE_CHARS
    assert evidence.loads(text)["schema"] == "kvforensics.snapshot/1"


def test_a_file_of_newlines_holding_a_marker_is_read_in_place(tmp_path):
    # A list of every line of 8 MiB of newlines would take 64 MiB; the marker is found in place.
    path = tmp_path / "probe.txt"
    path.write_bytes(b"\n" * (8 << 20) + b"KVF-PROBE {not json}\n")
    code, _, err = run_cli(["inspect", "--from", str(path)])
    assert code == 2 and len(err.strip().splitlines()) == 1


_PEAK = PEAK + textwrap.dedent("""
    import sys
    from kvforensics.agent.remote import bundles
    try:
        bundles.load(sys.argv[1])
    except bundles.BundleError as exc:
        print("refused:", str(exc)[:200], file=sys.stderr)
    print(peak())
""")


def _peak_bytes(path: Path) -> int:
    """The peak a bundle costs over reading a shipped one (the same code imported, the same validator built)."""
    small = str(ROOT / "examples" / "vllm-node.json")
    baseline = subprocess.run([sys.executable, "-c", _PEAK, small], capture_output=True, text=True,
                              cwd=str(ROOT), check=True)
    run = subprocess.run([sys.executable, "-c", _PEAK, str(path)], capture_output=True, text=True, cwd=str(ROOT),
                         check=True)
    return int(run.stdout.split()[-1]) - int(baseline.stdout.split()[-1])


def test_a_bundle_of_empty_gpu_entries_peaks_near_its_size_not_at_20x(tmp_path):
    # 16 MiB of "{}," once took ~450 MB (28×) before the schema refused it; now the text and its bytes.
    text = json.dumps(SEED).replace('"gpus": [', '"gpus": [' + "{}," * ((16 << 20) // 3), 1)
    path = tmp_path / "gpus.json"
    path.write_text(text, encoding="utf-8")
    assert _peak_bytes(path) < 4 * len(text)


def test_a_large_real_shaped_bundle_peaks_within_4x_its_size(tmp_path):
    doc = copy.deepcopy(VLLM)
    rows = doc["engine_log"]["lines"]
    doc["engine_log"]["lines"] = [[None, 5000 * i + r[1], r[2]] for i in range(1200) for r in rows]
    path = _write(tmp_path, doc)
    assert path.stat().st_size > 3 << 20
    assert _peak_bytes(path) < 4 * path.stat().st_size


# --- the seeded mutation campaign -----------------------------------------------------------

FUZZ_CASES = int(os.environ.get("KVF_FUZZ_CASES", "400"))
FUZZ_SEED = int(os.environ.get("KVF_FUZZ_SEED", "20261201"))
CHUNKS = 8
VALUES: List[Any] = [None, "", "x", "12", "0.9", "nan", 0, -1, 1, 7, 2**63, 10**30, 0.5, 1e300, -1e300, True, False,
                     [], {}, [1], {"a": 1}, "a" * 5000]
STATUSES = ["ok", "partial", "absent", "failed", "lost"]
FLAGS = ["max_model_len", "page_size", "tp_size", "dp_size", "pp_size", "mem_fraction_static", "gpu_memory_utilization",
         "max_running_requests", "max_total_tokens", "context_length", "kv_cache_dtype", "model", "model_path",
         "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
         "cuda_graph_max_bs", "enable_dp_attention", "tensor_parallel_size", "pipeline_parallel_size",
         "enable_hierarchical_cache", "kv_cache_memory_bytes", "chunked_prefill_size", "api_key"]


def _paths(x: Any, at: tuple = ()) -> List[tuple]:
    out = [at]
    if isinstance(x, dict):
        for k, v in x.items():
            out += _paths(v, at + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x[:3]):
            out += _paths(v, at + (i,))
    return out


def _structural(doc: Dict[str, Any], rng: random.Random) -> None:
    """Anything anywhere: a key dropped, a value of another type, an item repeated (mostly refused by
    the schema, exit 2)."""
    at = rng.choice([p for p in _paths(doc) if p and p != ("schema",)])
    parent = doc
    for k in at[:-1]:
        parent = parent[k]
    op = rng.random()
    if op < 0.3 and isinstance(parent, dict):
        parent.pop(at[-1], None)
    elif op < 0.45 and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[at[-1]]))
    else:
        parent[at[-1]] = copy.deepcopy(rng.choice(VALUES))


def _flags(doc: Dict[str, Any], rng: random.Random) -> None:
    """The flags a report reads, forged (the schema lets server_args be any object)."""
    for e in doc["engines"]["engines"]:
        for args in (e.setdefault("server_args", {}), (e.get("server") or {}).get("server_args")):
            if isinstance(args, dict):
                args[rng.choice(FLAGS)] = copy.deepcopy(rng.choice(VALUES))
    if rng.random() < 0.5:  # without the log's own arguments the bundle's are used
        doc["engine_log"]["lines"] = [r for r in doc["engine_log"]["lines"]
                                      if "server_args=" not in r[2] and "args:" not in r[2]
                                      and "Initializing" not in r[2]]


def _kinds(doc: Dict[str, Any], rng: random.Random) -> None:
    """Statuses and engine kinds the schema allows, in any combination."""
    choice = rng.randrange(5)
    if choice == 0 and doc["engines"]["engines"]:
        rng.choice(doc["engines"]["engines"])["kind"] = rng.choice(["sglang", "vllm"])
    elif choice == 1:
        doc["engine_log"]["engine"] = rng.choice(["sglang", "vllm", None])
    elif choice == 2:
        rng.choice(doc["nvml"]["gpus"])["status"] = rng.choice(["ok", "partial", "lost"])
    elif choice == 3:
        doc["nvml"]["status"] = rng.choice(STATUSES)
    else:
        doc["engines"]["engines"] = doc["engines"]["engines"][:rng.randrange(2)]


def _log(doc: Dict[str, Any], rng: random.Random) -> None:
    """The startup's saved lines mutated as a log is (tests/test_fuzz_logs.py), or another bundle's."""
    if rng.random() < 0.2:
        doc["engine_log"] = copy.deepcopy(rng.choice([SEED, VLLM])["engine_log"])
        return
    rows = doc["engine_log"]["lines"]
    text = mutate_log("\n".join(r[2] for r in rows).encode("utf-8"), rng).decode("utf-8", "replace")
    doc["engine_log"]["lines"] = [[i + 1, i * 100, line[:1 << 20]] for i, line in enumerate(text.split("\n"))]


MUTATORS = (_structural, _flags, _flags, _kinds, _kinds, _log, _log)


def _case(case: int) -> Dict[str, Any]:
    rng = random.Random(FUZZ_SEED * 1_000_003 + case)
    doc = copy.deepcopy(rng.choice([SEED, VLLM]))
    for _ in range(rng.randint(1, 4)):
        try:
            rng.choice(MUTATORS)(doc, rng)
        except (KeyError, IndexError, TypeError, AttributeError):
            pass  # a structural mutation removed what a later one looks for: the case goes on as it is
    return doc


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_mutated_bundles_never_crash_and_json_stays_valid(tmp_path, chunk):
    per = -(-FUZZ_CASES // CHUNKS)
    for case in range(chunk * per, min(FUZZ_CASES, (chunk + 1) * per)):
        path = tmp_path / "bundle.json"
        path.write_text(json.dumps(_case(case)), encoding="utf-8")  # Python's json writes 1e300 as is
        try:
            _inspect_everywhere(path, (FORMATS[0], FORMATS[1 + case % 3]))
        except BaseException as exc:
            raise AssertionError("case {} (KVF_FUZZ_SEED={}): {}".format(case, FUZZ_SEED, str(exc)[:2000])) from exc
