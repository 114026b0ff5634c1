"""engine_http for vLLM: its /metrics page parsed (per-engine sums and maxima, cache_config_info's
labels) and read from a real HTTP server on an ephemeral loopback port.

The fixtures under tests/fixtures/vllm_metrics/ carry the metric names and labels of vLLM's own
source, release by release (each has a sidecar .md saying where they came from)."""

from __future__ import annotations

import http.server
import json
import math
import socket
from contextlib import contextmanager
from typing import Iterator

import pytest

from kvforensics.collectors import engine_http, exposition, loopback
from kvforensics.collectors.vllm import metrics as vllm_metrics
from tests.conftest import FIXTURES
from tests.loopback_http import serving

VLLM = FIXTURES / "vllm_metrics"


def fixture(name: str) -> str:
    return (VLLM / name).read_text(encoding="utf-8")


# --- the sample parser -------------------------------------------------------------------------

def test_labels_with_escapes_commas_and_braces_inside_values():
    line = r'vllm:x{a="say \"hi\", then {go}",b="back\\slash",c="two\nlines",d="\q"} 1.5'
    name, labels, value = exposition.parse_sample(line)
    assert name == "vllm:x" and value == 1.5
    assert labels == {"a": 'say "hi", then {go}', "b": "back\\slash", "c": "two\nlines", "d": "\\q"}


@pytest.mark.parametrize("line", [
    "vllm:x NaN", "vllm:x +Inf", "vllm:x -Inf", "vllm:x nan", "vllm:x 1_000", "vllm:x",
    'vllm:x{a="open} 1', 'vllm:x{a="1" b="2"} 1', 'vllm:x{a=1} 1', "vllm:x 1 2 3", "vllm:x{}1x",
    "vllm:x1.0", "# TYPE vllm:x gauge", "", "  ", "{} 1", "=1",
])
def test_non_finite_and_garbage_lines_give_no_sample(line):
    assert exposition.parse_sample(line) is None


def test_a_sample_may_carry_a_timestamp_and_a_trailing_comma():
    assert exposition.parse_sample('vllm:x{a="1",} 2.5e+01 1700000000000') == ("vllm:x", {"a": "1"}, 25.0)
    assert exposition.parse_sample("vllm:x 3") == ("vllm:x", {}, 3.0)


def test_a_repeated_sample_counts_once():
    text = 'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="0"} 2\n'
    assert vllm_metrics.parse(text)[0] == {"vllm:num_requests_running": 2.0}


# --- whole pages, release by release -------------------------------------------------------------

def test_v0_engine_old_name_0_6_3():
    metrics, config = vllm_metrics.parse(fixture("v0.6.3_v0_engine.prom"))
    # cpu_cache_usage_perc, num_requests_swapped, the _created gauges and histograms are not read
    assert metrics == {"vllm:num_requests_running": 7.0, "vllm:num_requests_waiting": 3.0,
                       "vllm:gpu_cache_usage_perc": 0.8125, "vllm:num_preemptions_total": 5.0}
    assert config == {"block_size": 16, "num_gpu_blocks": 7281, "num_cpu_blocks": 512, "gpu_memory_utilization": 0.9,
                      "cache_dtype": "auto", "num_gpu_blocks_override": None, "swap_space_bytes": 4294967296,
                      "cpu_offload_gb": 0, "enable_prefix_caching": "False", "sliding_window": None,
                      "is_attention_free": "False"}


def test_v1_engine_new_name_two_engines_0_11_0():
    metrics, config = vllm_metrics.parse(fixture("v0.11.0_v1_dp2.prom"))
    # running 12 + 9, waiting 0 + 4 (engine 2's NaN skipped), usage max(0.25, 0.625) (its +Inf
    # skipped), preemptions 2 + 1; the garbage lines add nothing
    assert metrics == {"vllm:num_requests_running": 21.0, "vllm:num_requests_waiting": 4.0,
                       "vllm:kv_cache_usage_perc": 0.625, "vllm:num_preemptions_total": 3.0}
    assert config["num_gpu_blocks"] == 58352 and config["block_size"] == 16
    assert config["gpu_memory_utilization"] == 0.9 and config["swap_space_bytes"] == 4294967296
    assert config["num_cpu_blocks"] is None and config["kv_cache_memory_bytes"] is None
    assert config["prefix_caching_hash_algo"] == "sha256" and config["enable_prefix_caching"] == "True"
    assert "engine" not in config  # the sample's engine index, not a CacheConfig attribute
    assert len(config) == 20


def test_newest_release_bounds_cache_config_to_32_labels_keeping_the_ones_that_matter():
    metrics, config = vllm_metrics.parse(fixture("v0.33.0_v1_dp2.prom"))
    # num_requests_waiting_by_reason shares a prefix with num_requests_waiting and must not be added
    assert metrics == {"vllm:num_requests_running": 21.0, "vllm:num_requests_waiting": 4.0,
                       "vllm:kv_cache_usage_perc": 0.625, "vllm:num_preemptions_total": 3.0}
    assert len(config) == vllm_metrics.CACHE_CONFIG_MAX_LABELS  # 37 attributes served
    assert {k: config[k] for k in ("block_size", "num_gpu_blocks", "gpu_memory_utilization", "cache_dtype",
                                   "kv_cache_size_tokens", "kv_cache_max_concurrency", "kv_cache_memory_bytes")} == {
        "block_size": 16, "num_gpu_blocks": 116704, "gpu_memory_utilization": 0.92, "cache_dtype": "fp8_e4m3",
        "kv_cache_size_tokens": 933632, "kv_cache_max_concurrency": 28.49, "kv_cache_memory_bytes": None}
    assert config["kv_cache_dtype_skip_layers"] == "['lm_head', 'model.layers.0']"


def test_both_cache_usage_names_are_kept_each_under_its_own():
    """0.10.2's V1 logger serves the deprecated name next to the new one."""
    text = ('vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75\n')
    assert vllm_metrics.parse(text) == (
        {"vllm:gpu_cache_usage_perc": 0.5, "vllm:kv_cache_usage_perc": 0.75}, None)


def test_cache_config_values_are_bounded():
    text = ('vllm:cache_config_info{big="1e16",neg="-2",inf="inf",nan="nan",fl="0.5",s="' + "x" * 80
            + '",exp="1.5e3",none="None",word="fp8"} 1.0\n')
    config = vllm_metrics.parse(text)[1]
    assert config == {"big": None, "neg": -2, "inf": None, "nan": None, "fl": 0.5, "s": "x" * 63 + "…",
                      "exp": 1500.0, "none": None, "word": "fp8"}
    assert all(len(v) <= vllm_metrics.CACHE_CONFIG_MAX_STR for v in config.values() if isinstance(v, str))
    many = "vllm:cache_config_info{" + ",".join('l{}="{}"'.format(i, i) for i in range(50)) + "} 1\n"
    assert len(vllm_metrics.parse(many)[1]) == 32


def test_no_cache_config_info_is_none_and_non_vllm_text_is_empty():
    assert vllm_metrics.parse("") == ({}, None)
    assert vllm_metrics.parse('sglang:token_usage 0.5\nprocess_cpu_seconds_total 3\n') == ({}, None)


def test_a_page_cut_by_the_read_limit_loses_only_its_last_partial_line(monkeypatch):
    monkeypatch.setattr(loopback, "READ_LIMIT", 64)
    body = b'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 12'
    assert loopback.whole_lines(body[:64]) == 'vllm:num_requests_running{engine="0"} 3\n'
    assert loopback.whole_lines(b"short 1") == "short 1"


# --- a real HTTP server on an ephemeral loopback port --------------------------------------------

class _MetricsOnly(http.server.BaseHTTPRequestHandler):
    """Like vLLM's API server for our purposes: /metrics, and 404 for SGLang's /server_info."""

    body = b""

    def do_GET(self):  # noqa: N802 - the name http.server calls
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):  # keep the test output quiet
        pass


@contextmanager
def metrics_server(body: bytes) -> Iterator[int]:
    with serving(type("Handler", (_MetricsOnly,), {"body": body})) as port:
        yield port


def test_collect_reads_a_live_vllm_metrics_page():
    with metrics_server(fixture("v0.11.0_v1_dp2.prom").encode("utf-8")) as port:
        s = engine_http.collect({"port": port, "host": "127.0.0.1"}, engine="vllm")
    assert s["status"] == "ok" and s["url"] == "http://127.0.0.1:{}".format(port)
    assert s["server_info"] is None and s["problems"] == []
    assert s["metrics"] == {"vllm:num_requests_running": 21.0, "vllm:num_requests_waiting": 4.0,
                            "vllm:kv_cache_usage_perc": 0.625, "vllm:num_preemptions_total": 3.0}
    assert s["cache_config"]["num_gpu_blocks"] == 58352
    assert set(s) == {"status", "url", "network_namespace", "server_info", "metrics", "cache_config", "problems"}
    # what the probe ships is strict JSON: no NaN or Infinity slipped through
    json.loads(json.dumps(s, allow_nan=False))
    assert all(math.isfinite(v) for v in s["metrics"].values())


def test_a_page_without_vllm_metrics_is_not_called_unreachable():
    with metrics_server(b"# HELP http_requests_total x\nhttp_requests_total 3\n") as port:
        s = engine_http.collect({"port": port}, engine="vllm")
    assert s["status"] == "absent" and s["metrics"] == {} and s["cache_config"] is None
    assert [p["code"] for p in s["problems"]] == ["engine_http.no_engine_metrics"]


def test_vllm_unreachable_port_is_absent():
    # Held bound but not listening for the whole call: no other process (a second copy of the suite)
    # can start listening there meanwhile, and a connection is refused at once.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        s = engine_http.collect({"port": port, "host": "127.0.0.1"}, engine="vllm")
    assert s["status"] == "absent" and s["url"] == "http://127.0.0.1:{}".format(port)
    assert s["cache_config"] is None and [p["code"] for p in s["problems"]] == ["engine_http.unreachable"]


@pytest.mark.parametrize("host", ["10.1.2.3", "192.168.0.7", "example.org"])
def test_vllm_non_loopback_host_is_never_contacted(host, monkeypatch):
    monkeypatch.setattr(loopback, "get", lambda url: pytest.fail("contacted {}".format(url)))
    s = engine_http.collect({"host": host, "port": 8000}, engine="vllm")
    assert s["status"] == "absent" and s["url"] is None
    assert [p["code"] for p in s["problems"]] == ["engine_http.not_loopback"]


@pytest.mark.parametrize("args,url", [({}, "http://127.0.0.1:8000"), ({"host": None, "port": 8123},
                                                                      "http://127.0.0.1:8123")])
def test_vllm_default_port_is_8000(args, url, monkeypatch):
    asked = []
    monkeypatch.setattr(loopback, "get", lambda u: asked.append(u))
    s = engine_http.collect(args, engine="vllm")
    assert s["url"] == url and asked == [url + "/metrics"]  # no /server_info: vLLM has none


def test_sglang_section_has_the_cache_config_key_too(monkeypatch):
    monkeypatch.setattr(loopback, "get", lambda u: None)
    s = engine_http.collect({"port": 30000}, engine="sglang")
    assert s["url"] == "http://127.0.0.1:30000" and s["cache_config"] is None


def test_unknown_engine_is_a_programming_error():
    with pytest.raises(ValueError):
        engine_http.collect({}, engine="tgi")


def test_section_matches_the_published_schema():
    """The engine_http part of the snapshot schema, checked on its own (a whole snapshot needs
    every other section)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((FIXTURES.parent.parent / "agent" / "schemas" / "snapshot.schema.json").read_text())
    sub = dict(schema["properties"]["engine_http"], **{"$defs": schema["$defs"]})
    with metrics_server(fixture("v0.33.0_v1_dp2.prom").encode("utf-8")) as port:
        s = engine_http.collect({"port": port}, engine="vllm")
    jsonschema.validate(s, sub)
    for bad in ({"x" * 65: 1}, {"s": "y" * 65}, {"b": True}, {"l{}".format(i): i for i in range(33)}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(dict(s, cache_config=bad), sub)
