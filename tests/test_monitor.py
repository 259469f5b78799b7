"""Monitors: real Prometheus text in, series out; a dead endpoint is a sample, not a crash."""

import anyio
import httpx
import pytest

from dsv4bench.servers.dialect import QUEUE_GAUGES, SGLANG
from dsv4bench.engine.metrics import METRIC_NAMES
from dsv4bench.servers.monitor import parse_metrics, scrape_once

TEXT = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="decode",model_name="m"} 58.0
# HELP sglang:num_aborted_requests_total Aborted requests.
# TYPE sglang:num_aborted_requests_total counter
sglang:num_aborted_requests_total{engine_type="decode",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
"""


def test_parse_metrics_keys_series_like_prometheus():
    v = parse_metrics(TEXT)
    assert v['sglang:num_running_reqs{engine_type="decode",model_name="m"}'] == 58.0
    assert v['sglang:num_aborted_requests_total{engine_type="decode",model_name="m"}'] == 3.0
    assert v['vllm:num_requests_waiting{model_name="m"}'] == 2.0


def test_scrape_once_ok_and_down():
    def handler(request):
        if request.url.path == "/metrics":
            return httpx.Response(200, text=TEXT)
        return httpx.Response(503, text="down")

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await scrape_once(c, "http://x/metrics", 1.0), await scrape_once(c, "http://x/other", 1.0)

    ok, down = anyio.run(main)
    assert ok.ok and ok.values['vllm:num_requests_waiting{model_name="m"}'] == 2.0
    assert not down.ok and "503" in down.error


@pytest.mark.parametrize("charset", ["zlib", "rot13", "utf-16"])  # codecs that cannot read this text
def test_a_metrics_page_in_a_charset_no_text_is_in_is_read_as_utf8(charset):
    def handler(request):
        return httpx.Response(200, headers={"content-type": f"text/plain; charset={charset}"}, content=TEXT.encode())

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await scrape_once(c, "http://x/metrics", 1.0)

    sample = anyio.run(main)
    assert sample.ok and sample.values['vllm:num_requests_waiting{model_name="m"}'] == 2.0


def test_the_bundled_engine_serves_every_sglang_gauge_the_harness_reads():
    assert {g for g in QUEUE_GAUGES if g.startswith(SGLANG)} <= set(METRIC_NAMES)
