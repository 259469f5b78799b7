"""Secrets out of run folders: the command line, a --recover-cmd, and any string written."""

import json
import shlex
import subprocess

from dsv4bench.redact import MASK, Redactor, redact_argv, redact_command, redact_credentials, shell_line

KEY = "sk-live-5ecret-9f8e7d"


def test_api_key_flag_becomes_its_environment_variable_in_both_spellings():
    argv = ["agents", "--url", "http://h/v1", "--api-key", KEY, "--api-key=" + KEY, "--sessions", "3"]
    red = redact_argv(argv)
    assert KEY not in " ".join(red)
    assert red == ["agents", "--url", "http://h/v1", "--api-key", "$DSV4BENCH_API_KEY",
                   "--api-key=$DSV4BENCH_API_KEY", "--sessions", "3"]


def test_reproduce_line_expands_the_variable_in_a_shell():
    line = shell_line(["dsv4bench", *redact_argv(["agents", "--api-key", KEY, "--scenario", "a b"])])
    assert KEY not in line
    # The shell reads it back as the same words with the key taken from the environment.
    words = subprocess.run(["bash", "-c", f"printf '%s\\n' {line[len('dsv4bench '):]}"], capture_output=True,
                           text=True, env={"DSV4BENCH_API_KEY": "FROM-ENV"}, check=True).stdout.splitlines()
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
    out = json.loads(r.json_text(json.dumps(rec)))
    assert KEY not in repr(out)
    assert out["n"] == 5 and out["ok"] is True and out["error"] == f"401: bad key {MASK}"


def test_redactor_leaves_model_prose_alone():
    # The server's answers are evidence: only the known secret goes, never words that merely
    # look like credentials.
    r = Redactor([KEY])
    prose = json.dumps({"content": "Basic steps: set TOKEN=abc and send Authorization: Bearer xyz"})
    assert r.json_text(prose) == prose
    assert not Redactor([None]) and Redactor([KEY])
