"""Secrets out of run folders: the command line, a --recover-cmd, and any record written, masked by
structure whatever the secret; the key only to named servers; run folders private."""

import json
import os
import shlex
import stat
import subprocess

import pytest

from dsv4bench.history.run_folder import HistoryWriter, encode_json, write_atomic
from dsv4bench.history.redact import (
    MASK,
    KeyScope,
    Redactor,
    origin,
    redact_argv,
    redact_command,
    redact_credentials,
    shell_line,
    text_maskable,
)

KEY = "sk-live-5ecret-9f8e7d"


def test_api_key_flag_becomes_its_environment_variable_in_both_spellings():
    argv = ["agents", "--url", "http://h/v1", "--api-key", KEY, "--api-key=" + KEY, "--sessions", "3"]
    red = redact_argv(argv)
    assert KEY not in " ".join(red)
    assert red == [
        "agents",
        "--url",
        "http://h/v1",
        "--api-key",
        "$DSV4BENCH_API_KEY",
        "--api-key=$DSV4BENCH_API_KEY",
        "--sessions",
        "3",
    ]


def test_reproduce_line_expands_the_variable_in_a_shell():
    line = shell_line(["dsv4bench", *redact_argv(["agents", "--api-key", KEY, "--scenario", "a b"])])
    assert KEY not in line
    # The shell reads it back as the same words with the key taken from the environment.
    words = subprocess.run(
        ["bash", "-c", f"printf '%s\\n' {line[len('dsv4bench ') :]}"],
        capture_output=True,
        text=True,
        env={"DSV4BENCH_API_KEY": "FROM-ENV"},
        check=True,
    ).stdout.splitlines()
    assert words == ["agents", "--api-key", "FROM-ENV", "--scenario", "a b"]


def test_pass_through_and_other_secret_flags_are_masked():
    red = redact_argv(["agents", f"--engine-arg=--api-key={KEY}", "--hf-token", KEY, f"--db-password={KEY}"])
    assert KEY not in " ".join(red)
    assert red[1] == f"--engine-arg=--api-key={MASK}" and red[3] == MASK and red[4] == f"--db-password={MASK}"


def test_password_in_a_url_is_masked():
    red = redact_argv(["agents", "--url", f"http://admin:{KEY}@10.0.0.5:8000/v1"])
    assert red[2] == f"http://{MASK}@10.0.0.5:8000/v1"


def test_recover_cmd_loses_its_credentials_but_keeps_its_shape():
    cmd = f'API_TOKEN={KEY} ./restart.sh --password {KEY} -H "Authorization: Bearer {KEY}" sglang-prefill'
    red = redact_command(cmd)
    assert KEY not in red
    assert shlex.split(red)[1:3] == ["./restart.sh", "--password"] and "sglang-prefill" in red
    assert redact_argv(["agents", "--recover-cmd", cmd])[2] == red
    assert redact_command("systemctl restart sglang") == "systemctl restart sglang"  # nothing to hide


def test_credential_patterns():
    assert KEY not in redact_credentials(f"curl -H 'Authorization: Bearer {KEY}' http://x")
    assert redact_credentials(f"OPENAI_API_KEY={KEY} run") == f"OPENAI_API_KEY={MASK} run"
    assert redact_credentials("nothing secret here: 3 tool calls") == "nothing secret here: 3 tool calls"


def test_redactor_scrubs_known_values_everywhere_in_a_record():
    r = Redactor([KEY, None, ""])
    rec = {"error": f"401: bad key {KEY}", "raw": [f"data: {KEY}"], KEY: 1, "n": 5, "ok": True}
    out = r.value(rec)
    assert KEY not in repr(out)
    assert out["n"] == 5 and out["ok"] is True and out["error"] == f"401: bad key {MASK}" and out[MASK] == 1
    assert rec["error"] == f"401: bad key {KEY}"  # the caller's object is left as it was


def test_redactor_leaves_model_prose_alone():
    # The server's answers are evidence: only the known secret goes, never words that merely
    # look like credentials.
    r = Redactor([KEY])
    prose = {"content": "Basic steps: set TOKEN=abc and send Authorization: Bearer xyz, see http://x/?q=1"}
    assert r.value(prose) == prose
    assert not Redactor([None]) and Redactor([KEY])


# Secrets a proxy client or a user may send that are JSON tokens, JSON syntax or common words: masking
# them inside serialized text would corrupt every record.
AWKWARD = ["true", "null", "turn", "ok", '"', "\\", "{", ":", ",", "false", "0", "session", "Bearer true"]


@pytest.mark.parametrize("secret", AWKWARD)
def test_a_secret_that_is_json_syntax_or_a_word_leaves_records_whole(secret, tmp_path):
    rec = {
        "session": "s1",
        "turn": 2,
        "ok": True,
        "gone": None,
        "text": 'say "ok", {true} \\ null: turn 0',
        "headers": {"Authorization": f"Bearer {secret}", "x-api-key": secret, "Content-Type": "a/b"},
        "nested": [{"api_key": secret, "tokens": 12}],
        "prompt_tokens": 3,
    }
    data, _ = encode_json(rec, Redactor([secret, f"Bearer {secret}"]))
    back = json.loads(data)
    # Everything but the credential fields is what it was; those are masked whatever their value.
    assert back["headers"] == {"Authorization": MASK, "x-api-key": MASK, "Content-Type": "a/b"}
    assert back["nested"] == [{"api_key": MASK, "tokens": 12}]
    for k in ("session", "turn", "ok", "gone", "text", "prompt_tokens"):
        assert back[k] == rec[k]


def test_history_files_stay_parseable_with_an_awkward_key(tmp_path):
    for i, secret in enumerate(AWKWARD):
        run = tmp_path / f"run{i}"
        h = HistoryWriter(run, {"run": "r", "config": {"api_key": secret, "url": "http://h/v1"}}, Redactor([secret]))
        for n in range(3):
            h.event("history_write_error", session="s", turn=n, error=f"{secret} true null")
        h.close()
        for line in (run / "events.jsonl").read_text().splitlines():
            assert json.loads(line)["error"] == f"{secret} true null"  # a short key is no secret in free text
        assert json.loads((run / "run.json").read_text())["config"] == {"api_key": MASK, "url": "http://h/v1"}


def test_short_or_common_secrets_are_not_masked_inside_text_and_long_ones_are():
    assert not text_maskable("true") and not text_maskable("Bearer ok") and not text_maskable("password")
    assert text_maskable(KEY) and text_maskable(f"Bearer {KEY}")
    r = Redactor(["ok", KEY])
    assert r.value({"t": f"ok {KEY} ok"}) == {"t": f"ok {MASK} ok"}


def test_urls_lose_their_credentials_and_key_parameters():
    r = Redactor()
    out = r.value(
        {
            "url": f"http://admin:{KEY}@10.0.0.5:8000/v1",
            "m": f"https://h/metrics?api_key={KEY}&x=1",
            "prose": f"see https://h/x?key={KEY} now",
        }
    )
    assert out["url"] == f"http://{MASK}@10.0.0.5:8000/v1"
    assert out["m"] == f"https://h/metrics?api_key={MASK}&x=1"
    assert out["prose"].endswith("now") and KEY in out["prose"]  # prose is the server's text: not a URL field


def test_masked_keys_that_collide_are_both_kept():
    out = Redactor([KEY]).value({f"a{KEY}": 1, f"a{MASK}": 2})
    assert sorted(out.values()) == [1, 2] and KEY not in repr(out)


def test_objects_json_cannot_hold_are_masked_as_their_text():
    class Odd:
        def __str__(self) -> str:
            return f"odd {KEY}"

    data, _ = encode_json({"o": Odd(), "t": (1, 2)}, Redactor([KEY]))
    assert json.loads(data) == {"o": f"odd {MASK}", "t": [1, 2]}


def test_a_circular_record_is_a_counted_failure_not_a_traceback(tmp_path):
    h = HistoryWriter(tmp_path / "run", {"run": "r"}, Redactor([KEY]))
    rec: dict = {}
    rec["self"] = rec
    assert h.events.write(rec) is False and h.events.failed == 1
    h.close()


def test_key_scope_sends_the_key_only_to_named_origins():
    scope = KeyScope(KEY, ["http://127.0.0.1:8000/v1", "http://127.0.0.1:9000/metrics"])
    assert scope.headers("http://127.0.0.1:8000/health") == {"Authorization": f"Bearer {KEY}"}
    assert scope.allows("http://127.0.0.1:9000/get_server_info")
    assert scope.headers("http://127.0.0.1:8001/health") == {}  # another port is another server
    assert not scope.allows("https://127.0.0.1:8000/health")  # and another scheme
    assert KeyScope(KEY, ["http://h/v1"]).allows("http://h:80/x")  # the default port spelled out or not
    assert KeyScope(KEY, [], to_workers=True).allows("http://elsewhere:1/x")
    assert not KeyScope(None, ["http://h/v1"]).allows("http://h/v1")
    assert scope.as_dict() == {
        "key_sent_to": ["http://127.0.0.1:8000", "http://127.0.0.1:9000"],
        "key_withheld_from": ["http://127.0.0.1:8001", "https://127.0.0.1:8000"],
        "key_to_workers": False,
    }
    assert origin("not a url") is None and origin("http://[::1]:5/x") == "http://[::1]:5"


def test_run_folder_and_its_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        h = HistoryWriter(tmp_path / "out" / "run", {"run": "r"}, None)
        h.event("run_start", run="r")
        h.close()
        write_atomic(tmp_path / "out" / "run" / "report.md", b"r")
    finally:
        os.umask(old)
    run = tmp_path / "out" / "run"
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run.iterdir()}
    assert modes == {n: 0o600 for n in ("run.json", "turns.jsonl", "events.jsonl", "metrics.jsonl", "report.md")}
