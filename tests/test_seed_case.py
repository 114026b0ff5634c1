"""Acceptance: the seed case (8 x RTX PRO 6000 Blackwell, Kimi-K2.5 TP8 + EAGLE-3, mfs 0.88)."""

from __future__ import annotations

from tests.conftest import GIB, SEED_CONFIG, SEED_LOG, gib, run_cli


def _finding(target: dict, code: str) -> dict:
    found = [f for f in target["findings"] if f["code"] == code]
    assert found, [f["code"] for f in target["findings"]]
    return found[0]


def test_reserve_is_taken_from_pre_load_free_memory(seed_json):
    budget = seed_json["startup"]["budget"]
    assert budget["mem_fraction_static"] == 0.88
    assert budget["pre_load_avail_min_bytes"] == gib(94.04)
    assert budget["post_load_avail_min_bytes"] == gib(21.71)
    # 0.12 x 94.04 GiB = 11.28 GiB, not 0.12 x 21.71 = 2.61 GiB
    assert budget["reserve_bytes"] == round(0.12 * gib(94.04))
    assert abs(budget["reserve_bytes"] / GIB - 11.2848) < 1e-3
    f = _finding(seed_json, "mem_fraction_semantics")
    assert f["bytes"] == budget["reserve_bytes"]
    assert "11.28 GiB" in f["title"] and "2.61 GiB" in f["title"] and "94.04 GiB" in f["title"]
    assert "19.10 GiB" in f["detail"] and "10.42 GiB" in f["detail"] and "8.68 GiB" in f["detail"]
    assert any(e.startswith("line 1:") for e in f["evidence"])  # server_args
    assert any("line 19" in e for e in f["evidence"]) and any("line 29" in e for e in f["evidence"])


def test_formula_matches_logged_tokens_within_rounding(seed_json):
    b = seed_json["startup"]["budget"]
    assert b["bytes_per_token"] == 70272  # (512 + 64) x 61 x 2, from --model-config
    assert b["logged_tokens"] == 159277
    # rest = 21.71 - 11.2848 GiB; floor(rest * 2^30 / 70272)
    assert b["predicted_tokens"] == int((gib(21.71) - round(0.12 * gib(94.04))) // 70272) == 159294
    assert b["predicted_tokens_low"] <= 159277 <= b["predicted_tokens_high"]
    assert b["predicted_tokens_high"] - b["predicted_tokens_low"] < 400  # only print rounding
    assert b["verdict"] == "agrees"
    assert _finding(seed_json, "kv_budget_check")["severity"] == "info"
    assert _finding(seed_json, "kv_geometry")["severity"] == "info"


def test_rank_ledger_numbers(seed_json):
    ranks = seed_json["startup"]["ranks"]
    assert [r["rank"] for r in ranks] == ["TP{}".format(i) for i in range(8)]
    tp3 = ranks[3]
    assert tp3["dist_init_bytes"] == gib(1.06)
    assert tp3["pre_load_avail_bytes"] == gib(94.04)
    assert tp3["weights_bytes"] == gib(72.33)
    assert tp3["post_load_avail_bytes"] == gib(21.71)
    assert tp3["kv_tokens"] == 159277 and tp3["kv_bytes"] == gib(10.42)
    assert tp3["bytes_per_token"] == round(gib(10.42) / 159278)  # from the log alone
    assert tp3["pool_end_avail_bytes"] == gib(11.18)
    assert tp3["graph_bytes"] == gib(1.43) and tp3["graph_end_avail_bytes"] == gib(9.12)
    assert tp3["workspace_bytes"] == gib(11.18) - gib(10.55)
    assert tp3["req_to_token_bytes"] == 64 * (262144 + 4 + 4) * 4
    assert tp3["reserve_bytes"] == round(0.12 * gib(94.04))
    d = tp3["draft"]
    assert d["model_type"] == "LlamaForCausalLMEagle3"
    assert d["weights_bytes"] == gib(2.31) and d["kv_bytes"] == 2 * gib(0.04)
    assert d["graph_bytes"] == gib(0.52) + gib(0.61)
    assert d["kv_tokens"] == 159277
    # every logged figure says where it came from
    assert tp3["sources"]["weights_bytes"].startswith("line ")
    assert "formula" in tp3["sources"]["reserve_bytes"] or "×" in tp3["sources"]["reserve_bytes"]


def test_where_the_reserve_went_adds_up(seed_json):
    f = _finding(seed_json, "reserve_breakdown")
    assert f["bytes"] == seed_json["startup"]["budget"]["reserve_bytes"]
    for item in ("req_to_token", "attention workspaces 0.63", "CUDA graphs (target) 1.43", "draft weights 2.31",
                 "CUDA graphs (draft) 1.13", "still free after startup 5.31"):
        assert item in f["detail"], item
    tp0 = seed_json["startup"]["ranks"][0]
    items = (tp0["weights_bytes"] + tp0["kv_bytes"] + tp0["req_to_token_bytes"] + tp0["workspace_bytes"]
             + tp0["graph_bytes"] + tp0["draft"]["weights_bytes"] + tp0["draft"]["kv_bytes"]
             + tp0["draft"]["graph_bytes"] + tp0["draft"]["workspace_bytes"])
    assert tp0["final_avail_bytes"] == gib(5.31)
    assert tp0["unexplained_bytes"] == tp0["pre_load_avail_bytes"] - tp0["final_avail_bytes"] - items
    assert 0 < tp0["unexplained_bytes"] < gib(0.5)


def test_draft_paid_out_of_the_reserve(seed_json):
    f = _finding(seed_json, "draft_in_reserve")
    assert f["severity"] == "warning"
    assert f["bytes"] == gib(2.31) + 2 * gib(0.04) + gib(0.52) + gib(0.61)
    assert "31%" in f["detail"]


def test_unused_memory_and_safe_change(seed_json):
    f = _finding(seed_json, "unused_gpu_memory")
    assert f["bytes"] == gib(5.31) - 2 * GIB  # default --margin 2 GiB
    rec = next(r for r in seed_json["recommendations"] if r["flag"] == "--mem-fraction-static")
    assert rec["value"] == "0.915"  # floor((0.88 + 3.31/94.04) * 1000) / 1000
    assert rec["gain_bytes"] == int(0.035 * gib(94.04)) or abs(rec["gain_bytes"] - 0.035 * gib(94.04)) < 2
    assert rec["gain_tokens"] == rec["gain_bytes"] // 70272
    assert rec["basis"] == "estimated"
    assert rec["gain_requests"] == {"at_context_len": 0,
                                    "at_request_tokens": (159277 + rec["gain_tokens"]) // 8192 - 19}


def test_concurrency_is_bound_by_kv_tokens(seed_json):
    f = _finding(seed_json, "concurrency_bound")
    assert "19 requests of 8,192 tokens" in f["title"] and "64 request slots" in f["title"]
    assert "not even one" in f["detail"]


def test_engine_and_startup_metadata(seed_json):
    assert seed_json["target"] == "file:" + str(SEED_LOG)
    assert seed_json["status"] == "ok"
    assert seed_json["engine"]["name"] == "sglang"
    assert seed_json["engine"]["version_hint"] == "0.5.6–0.5.8"
    s = seed_json["startup"]
    assert (s["index"], s["count"], s["first_line"]) == (1, 1, 1)
    assert (s["max_total_num_tokens"], s["max_running_requests"], s["context_len"]) == (159277, 64, 262144)
    assert s["startup_avail_bytes"] == gib(5.31)
    assert s["failure"] is None


def test_without_model_config_bytes_per_token_come_from_the_log():
    from tests.conftest import run_json

    code, doc = run_json(["analyze", str(SEED_LOG)])
    b = doc["targets"][0]["startup"]["budget"]
    assert b["bytes_per_token"] == round(gib(10.42) / 159278)
    assert "from the log" in b["bytes_per_token_source"]
    assert b["verdict"] == "agrees"


def test_terminal_report_shows_the_story():
    code, out, err = run_cli(["analyze", str(SEED_LOG), "--no-color", "--detail"])
    assert code == 1 and err == ""
    for text in ("TP0", "TP1–TP7", "11.28", "94.04", "Where the 11.28 GiB reserve went", "--mem-fraction-static 0.915",
                 "mem_fraction_semantics", "unused_gpu_memory", "draft_in_reserve", "concurrency_bound",
                 "Where each GPU's pre-load free memory went"):
        assert text in out, text
    assert "\x1b[" not in out


def test_the_default_report_is_the_answer_on_one_screen(monkeypatch):
    """At 80 columns the seed case fits a 40-row terminal: the verdict with the unused memory and the
    action, the startup in brief, each finding and recommendation in a line, and how to see the rest."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(["analyze", str(SEED_LOG), "--model-config", str(SEED_CONFIG), "--no-color"])
    lines = out.splitlines()
    assert code == 1 and err == "" and len(lines) <= 40 and all(len(x) <= 80 for x in lines)
    assert lines[1] == "Why is the KV cache 10.42 GiB per rank (159,277 tokens)?"
    assert lines[2] == "  cause   SGLang takes its (1 − 0.88) reserve from the 94.04 GiB free before the"
    assert any("5.31 GiB of it is still free." in x for x in lines[3:7])
    assert any(x.startswith("  proof   5.31 GiB free after startup − 2.00 GiB margin (--margin's default)")
               for x in lines[:10])
    assert any(x.startswith("  action  --mem-fraction-static 0.915") for x in lines[:12])
    assert "WARNING  3.31 GiB of GPU memory sits unused on every GPU after startup" in lines
    assert "1. --mem-fraction-static 0.915: +50,291 KV tokens, +6 requests (estimated)" in lines
    assert lines[-1].endswith("add --detail")
    for detail in ("TP1–TP7", "Where each GPU's pre-load free memory went", "evidence:", "[1]"):
        assert detail not in out, detail
