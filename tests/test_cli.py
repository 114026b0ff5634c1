"""The command line: exit codes, options, the JSON contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SEED_CONFIG, SEED_LOG, run_cli, run_json

TARGET_KEYS = {"target", "status", "problems", "engine", "startup", "findings", "recommendations", "verdict"}
VERDICT_KEYS = {"question", "cause", "cause_finding", "symptom_finding", "proof", "action", "action_recommendation"}
ENGINE_KEYS = {"name", "version_hint", "version_clues", "server_args"}
STARTUP_KEYS = {"index", "count", "first_line", "max_total_num_tokens", "max_running_requests", "context_len",
                "startup_avail_bytes", "ranks", "failure", "budget", "complete", "stages"}
RANK_KEYS = {"rank", "dist_init_bytes", "pre_load_avail_bytes", "weights_bytes", "post_load_avail_bytes",
             "kv_tokens", "kv_bytes", "bytes_per_token", "pool_end_avail_bytes", "graph_bytes",
             "graph_end_avail_bytes", "reserve_bytes", "draft"}
FINDING_KEYS = {"code", "severity", "title", "detail", "bytes", "evidence"}
REC_KEYS = {"flag", "value", "gain_bytes", "gain_tokens", "gain_requests", "basis", "rationale"}


def test_json_contract(seed_json):
    assert TARGET_KEYS == set(seed_json)
    assert ENGINE_KEYS == set(seed_json["engine"])
    assert STARTUP_KEYS == set(seed_json["startup"])
    for rank in seed_json["startup"]["ranks"]:
        assert RANK_KEYS <= set(rank)
        assert RANK_KEYS - {"rank", "draft"} <= set(rank["draft"])
        for key, value in rank.items():
            if key.endswith("_bytes"):
                assert value is None or isinstance(value, int), key
    for f in seed_json["findings"]:
        assert set(f) == FINDING_KEYS
    for r in seed_json["recommendations"]:
        assert set(r) == REC_KEYS and r["basis"] in ("measured", "estimated")
    assert set(seed_json["verdict"]) == VERDICT_KEYS


def test_top_level_schema():
    code, doc = run_json(["analyze", str(SEED_LOG)])
    assert set(doc) == {"schema", "targets"} and doc["schema"] == "kvforensics.report/1"


@pytest.mark.parametrize("fail_on,expected", [("info", 1), ("warning", 1), ("error", 0), ("critical", 0), ("never", 0)])
def test_fail_on_sets_the_exit_code(fail_on, expected):
    code, out, err = run_cli(["analyze", str(SEED_LOG), "--fail-on", fail_on, "--no-color"])
    assert code == expected and out and not err


@pytest.mark.parametrize("argv,message", [
    (["analyze", str(SEED_LOG), "--fail-on", "sometimes"], "--fail-on must be one of"),
    (["analyze", str(SEED_LOG), "--margin", "-1"], "--margin"),
    (["analyze", str(SEED_LOG), "--request-tokens", "0"], "--request-tokens"),
    (["analyze", str(SEED_LOG), "--startup", "0"], "--startup counts from 1"),
    (["analyze", str(SEED_LOG), "--model-config", "/nonexistent"], "no config.json"),
    (["analyze"], "Missing argument"),
    (["analyze", str(SEED_LOG), "--bogus"], "No such option"),
    (["nosuchcommand"], "No such command"),
])
def test_usage_errors_exit_2_with_one_line(argv, message):
    code, out, err = run_cli(argv)
    assert code == 2, err
    assert message in err and "Traceback" not in err


def test_bad_model_config_json(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    code, _, err = run_cli(["analyze", str(SEED_LOG), "--model-config", str(bad)])
    assert code == 2 and "not valid JSON" in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_report_sent_to_a_full_disk_is_one_line_and_exit_2():
    """``> file`` on a full disk (/dev/full says ENOSPC to every write): the command ran, its report could not be
    kept; said in one line, not as an internal error. Run as users run it (the console script's exit path)."""
    for fmt in ("terminal", "oneline"):  # a long report fails while written, a short one when flushed at exit
        with open("/dev/full", "w") as full:
            proc = subprocess.run([sys.executable, "-m", "kvforensics", "analyze", str(SEED_LOG), "--format", fmt],
                                  stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
        assert (proc.returncode, proc.stderr) == (
            2, "kvforensics: error: the output could not be written: No space left on device\n"), fmt


def test_internal_errors_exit_4_without_traceback(monkeypatch):
    import kvforensics.agent.model.analyze

    def boom(*a, **k):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(kvforensics.agent.model.analyze, "analyze_startup", boom)
    code, out, err = run_cli(["analyze", str(SEED_LOG)])
    assert code == 4 and "internal error: RuntimeError: simulated bug" in err and "Traceback" not in err


def test_help_lists_the_command_and_exit_is_0():
    code, out, err = run_cli(["--help"])
    assert code == 0 and "analyze" in out
    code, out, err = run_cli(["analyze", "--help"])
    assert code == 0 and "--request-tokens" in out and "--fail-on" in out


def test_console_script_runs_as_a_process():
    proc = subprocess.run([sys.executable, "-m", "kvforensics", "analyze", str(SEED_LOG), "--json", "--model-config",
                           str(SEED_CONFIG), "--fail-on", "never"], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["targets"][0]["startup"]["budget"]["predicted_tokens"] == 159294


def test_colour_only_when_asked():
    code, out, _ = run_cli(["analyze", str(SEED_LOG), "--color"])
    assert "\x1b[" in out
    code, out, _ = run_cli(["analyze", str(SEED_LOG)])  # not a terminal
    assert "\x1b[" not in out


@pytest.mark.parametrize("name", ["report", "snapshot", "history"])
def test_published_schemas_are_valid_json_schemas(name):
    import jsonschema

    code, out, err = run_cli(["schema", name])
    assert code == 0, err
    doc = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(doc)
    assert doc["title"] == "kvforensics.{}/1".format(name)


def test_non_finite_numbers_never_reach_json(tmp_path):
    """server_args can carry 1e999 or nan: the report says null, never Infinity/NaN (invalid JSON)."""
    log = tmp_path / "x.log"
    log.write_bytes(SEED_LOG.read_bytes().replace(b"mem_fraction_static=0.88", b"mem_fraction_static=0.88, "
                                                                           b"weird_a=1e999, weird_b=nan", 1))
    code, out, err = run_cli(["analyze", str(log), "--json"])
    assert "Infinity" not in out and "NaN" not in out
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(c))
    assert doc["targets"][0]["engine"]["server_args"]["weird_a"] is None


def test_version_and_short_help():
    code, out, err = run_cli(["-V"])
    assert code == 0 and out.startswith("kvforensics ")
    code, out, err = run_cli(["--version"])
    assert code == 0 and out.startswith("kvforensics ")
    for argv in (["-h"], ["analyze", "-h"], ["inspect", "-h"], ["record", "-h"]):
        code, out, err = run_cli(argv)
        assert code == 0 and out.startswith("Usage: kvforensics"), argv


def test_shell_completion_is_installable():
    code, out, err = run_cli(["--help"])
    assert "--install-completion" in out and "--show-completion" in out


@pytest.mark.parametrize("margin, ok", [("2GiB", True), ("512MiB", True), ("1.5", True), ("2G", True),
                                        ("inf", False), ("1e308", False), ("nan", False), ("2 parsecs", False)])
def test_margin_takes_sizes_with_units(margin, ok):
    code, out, err = run_cli(["analyze", str(SEED_LOG), "--margin", margin, "--fail-on", "never", "--format", "json"])
    assert (code == 0) is ok, err
    if not ok:
        assert err.startswith("kvforensics: error: --margin") and err.count("\n") == 1


def test_help_has_readable_metavars():
    code, out, err = run_cli(["inspect", "--help"])
    assert "<str>" not in out and "<list[str]>" not in out and "{" not in out.split("\n")[0]
    assert "--hosts-file FILE" in out and "--margin SIZE" in out and "[HOST…]" in out


def test_oneline_and_sort():
    bundle = str(ROOT / "examples" / "seed-node.json")
    code, out, err = run_cli(["inspect", "--from", bundle, "--format", "oneline", "--sort", "unused"])
    header, row = out.strip().split("\n")
    assert header.split("\t") == ["host", "status", "GPUs", "engine", "model", "KV tokens", "unused GiB", "severity",
                                  "worst finding"]
    cells = row.split("\t")
    assert cells[1] == "ok" and len(cells) == 9
    # plain numbers (digits, GiB as the header says) and words, never an internal code alone
    assert cells[5] == "159277" and cells[6] == "3.06" and cells[7] == "warning"
    assert cells[8] == "The draft model (LlamaForCausalLMEagle3) took 3.52 GiB out of the reserve"
    assert run_cli(["inspect", "--from", bundle, "--sort", "nope"])[0] == 2
    assert run_cli(["inspect", "--identity", "/nonexistent/key", "somehost"])[0] == 2
