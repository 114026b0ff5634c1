"""The answer first: every report's verdict comes from the findings and recommendations it shows."""

from __future__ import annotations

from tests.conftest import FIXTURES, SEED_CONFIG, SEED_LOG, run_json

INPUTS = FIXTURES / "golden" / "inputs"
FAILED = INPUTS / "log-150aa9b4949e7c8e.startup-1.log"  # not enough memory for the KV cache
FRAGMENT = INPUTS / "log-71806c9814120be0.startup-1.log"  # stops before the summary
ORPHANED = INPUTS / "snap-63dee743c452eb36.bundle.json"  # memory held by a PID that is gone
LOST = INPUTS / "snap-26058c2deed84b44.bundle.json"  # a lost GPU


def _target(argv):
    code, doc = run_json(argv)
    return doc["targets"][0]


def test_seed_case_verdict_is_the_mem_fraction_semantics():
    t = _target(["analyze", str(SEED_LOG), "--model-config", str(SEED_CONFIG)])
    v = t["verdict"]
    assert v["question"] == "Why is the KV cache 10.42 GiB per rank (159,277 tokens)?"
    assert v["cause_finding"] == "mem_fraction_semantics"
    assert v["cause"].startswith("--mem-fraction-static 0.88 reserved 11.28 GiB of the 94.04 GiB free before "
                                 "loading, not 2.61 GiB of the 21.71 GiB left after")
    assert "(1 − 0.88) × 94.04 GiB = 11.28 GiB reserve" in v["proof"] and "logged 10.42 GiB" in v["proof"]
    rec = t["recommendations"][v["action_recommendation"]]
    assert v["action_recommendation"] == 0 and rec["flag"] == "--mem-fraction-static"
    assert v["action"].startswith("--mem-fraction-static 0.915: +3.29 GiB, +{:,} KV tokens per rank".format(
        rec["gain_tokens"]))
    assert "recommendation 1 of {}".format(len(t["recommendations"])) in v["action"]


def test_a_failed_startup_answers_why_it_failed_and_gives_its_fix():
    t = _target(["analyze", str(FAILED)])
    v = t["verdict"]
    assert t["findings"][0]["code"] == "startup_failed" == v["cause_finding"]
    assert v["question"] == "Why did the startup fail?"
    assert v["cause"].startswith("The startup failed")
    assert v["action_recommendation"] == 0 and v["action"].startswith(t["recommendations"][0]["flag"])


def test_a_fragment_says_what_to_paste():
    v = _target(["analyze", str(FRAGMENT)])["verdict"]
    assert v["cause_finding"] == "incomplete_startup" and v["action_recommendation"] is None
    assert "server_args=" in v["action"] and "kvforensics inspect" in v["action"]
    assert "not shown:" in v["proof"]


def test_on_a_node_what_breaks_it_comes_first():
    v = _target(["inspect", "--from", str(ORPHANED)])["verdict"]
    assert v["question"].startswith("Where did the GPU memory go?")
    assert v["cause_finding"] == "orphaned_gpu_memory" and "lsof /dev/nvidia*" in v["action"]
    assert "does not exist" in v["proof"]
    v = _target(["inspect", "--from", str(LOST)])["verdict"]
    assert v["cause_finding"] == "gpu_lost" and "nvidia-smi -r" in v["action"]


def test_the_seed_node_verdict_quotes_the_measured_raise():
    t = _target(["inspect", "--from", str(FIXTURES.parent.parent / "examples" / "seed-node.json")])
    v = t["verdict"]
    assert v["question"] == "Where did the GPU memory go? Why is the KV cache 10.42 GiB per rank?"
    assert v["action"].startswith("--mem-fraction-static 0.912: +3.01 GiB, +45,981 KV tokens per rank (estimated")
