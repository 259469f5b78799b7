"""The API key goes only to the hosts the user named: a router whose /workers lists a server on
another origin (here a loopback sink on another port that records every header it gets) must not
make `probe` or `agents` send it there, unless --key-to-workers says so; and both say which
hosts got it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .conftest import only_run_dir, run_cli

KEY = "sk-test-0123456789abcdef"
METRICS = b"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n"


def _answer(stream: bool) -> tuple[str, bytes]:
    message = {"role": "assistant", "content": "done"}
    if not stream:
        return "application/json", json.dumps(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        ).encode()
    chunks = [
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        for delta, finish in (({"role": "assistant", "content": "done"}, None), ({}, "stop"))
    ]
    return "text/event-stream", b"".join(
        b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks
    ) + b"data: [DONE]\n\n"


class Server:
    """A loopback server that answers as an OpenAI server (and, given `workers`, as a router that
    lists them) and records the Authorization header of every request it gets."""

    def __init__(self, workers: list[str] | None = None) -> None:
        self.seen: list[tuple[str, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                outer.seen.append((self.path, self.headers.get("Authorization")))
                path = self.path.split("?")[0]
                if path == "/workers" and workers is not None:
                    self._send(
                        200,
                        "application/json",
                        json.dumps(
                            {"workers": [{"url": w, "worker_type": "regular", "is_healthy": True} for w in workers]}
                        ).encode(),
                    )
                elif path == "/metrics":
                    self._send(200, "text/plain", METRICS)
                elif path == "/v1/models":
                    self._send(200, "application/json", b'{"object":"list","data":[{"id":"m","object":"model"}]}')
                elif path in ("/health", "/health_generate"):
                    self._send(200, "text/plain", b"ok")
                elif path == "/get_server_info":
                    self._send(200, "application/json", b"{}")
                else:
                    self._send(404, "application/json", b'{"error":"not found"}')

            def do_POST(self) -> None:
                outer.seen.append((self.path, self.headers.get("Authorization")))
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path.split("?")[0] == "/v1/chat/completions":
                    self._send(200, *_answer(bool(body.get("stream"))))
                else:
                    self._send(404, "application/json", b'{"error":"not found"}')

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.root = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def keyed(self) -> list[str]:
        return sorted({path for path, auth in self.seen if auth})

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def router_and_sink():
    sink = Server()
    router = Server(workers=[sink.root])
    yield router, sink
    router.stop()
    sink.stop()


def test_probe_sends_no_key_to_a_worker_the_user_never_named(router_and_sink, tmp_path):
    router, sink = router_and_sink
    out = tmp_path / "probe.json"
    r = run_cli("probe", router.root, "--api-key", KEY, "--timeout", "5", "--stuck-s", "0", "--json", str(out))
    assert r.returncode in (0, 1), r.stdout + r.stderr
    paths = {p for p, _ in sink.seen}
    assert "/metrics" in paths and "/v1/chat/completions" in paths, sink.seen  # it was probed, canary and all
    assert sink.keyed() == []
    assert router.keyed() and all(auth == f"Bearer {KEY}" for _, auth in router.seen)
    key = json.loads(out.read_text())["key"]
    assert key == {"key_sent_to": [router.root], "key_withheld_from": [sink.root], "key_to_workers": False}
    assert f"API key sent to: {router.root}; not sent to {sink.root}" in " ".join(r.stdout.split())


def test_probe_with_key_to_workers_sends_it_there(router_and_sink):
    router, sink = router_and_sink
    r = run_cli("probe", router.root, "--api-key", KEY, "--timeout", "5", "--stuck-s", "0", "--key-to-workers")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert "/metrics" in sink.keyed() and "/v1/chat/completions" in sink.keyed()
    line = next(line for line in r.stdout.splitlines() if line.startswith("API key sent to:"))
    assert sorted(line.removeprefix("API key sent to: ").split(", ")) == sorted([router.root, sink.root])


def _agents(router: Server, tmp_path, *extra: str):
    return run_cli(
        "agents",
        "--url",
        f"{router.root}/v1",
        "--api-key",
        KEY,
        "--sessions",
        "1",
        "--max-turns",
        "1",
        "--no-stream",
        "--metrics-interval",
        "0.2",
        "--drain-timeout",
        "1",
        "--canary-timeout",
        "5",
        "--quiet",
        "--out",
        str(tmp_path),
        *extra,
    )


def test_agents_sends_no_key_to_a_worker_the_user_never_named(router_and_sink, tmp_path):
    router, sink = router_and_sink
    r = _agents(router, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "/metrics" in {p for p, _ in sink.seen} and "/health" in {p for p, _ in sink.seen}, sink.seen
    assert sink.keyed() == []
    assert "/v1/chat/completions" in router.keyed()
    report = (only_run_dir(tmp_path) / "report.md").read_text()
    assert (
        f"API key sent to: `{router.root.removeprefix('http://')}`" in report
        or f"API key sent to: `{router.root}`" in report
    ), report
    assert "not sent to" in report and sink.root.rsplit(":", 1)[1] in report.split("not sent to", 1)[1]
    assert KEY not in "".join(p.read_text(errors="replace") for p in only_run_dir(tmp_path).rglob("*") if p.is_file())


def test_agents_with_key_to_workers_sends_it_to_the_worker_too(router_and_sink, tmp_path):
    router, sink = router_and_sink
    r = _agents(router, tmp_path, "--key-to-workers")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "/metrics" in sink.keyed() and "/health" in sink.keyed()
    report = (only_run_dir(tmp_path) / "report.md").read_text()
    assert "not sent to" not in report and "API key sent to:" in report
