"""triage.py and recheck.py without I/O: the classes, which findings are kept, the cold request,
the sampling of recheck and the comparison it makes."""

from __future__ import annotations

import pytest

from dsv4bench.harness.config import ConfigError, RunConfig
from dsv4bench.harness.recheck import RECHECK_MAX, RecheckKeep, changed_verdict
from dsv4bench.harness.reference_run import request_key
from dsv4bench.harness.config import triage_limit
from dsv4bench.harness.triage import FindingKeep, classify, cold_body
from dsv4bench.history.records import AssembledResponse, ReferenceAnswer, Verdict


def _headers(session: str, turn: int, scenario: str = "coding") -> dict[str, str]:
    return {"X-Dsv4bench-Session": session, "X-Dsv4bench-Turn": str(turn), "X-Dsv4bench-Scenario": scenario}


def _body(text: str, temperature: float = 0) -> dict:
    return {"model": "m", "temperature": temperature, "messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize(
    ("hits", "cold", "cls"),
    [
        (3, True, "deterministic"),
        (3, False, "cache_state"),
        (1, False, "cache_state"),
        (2, True, "intermittent"),
        (0, True, "cold_path"),
        (0, False, "load_dependent"),
        (0, None, "not_classed"),
    ],
)
def test_classes(hits, cold, cls):
    assert classify(hits, 3, cold) == cls


def test_triage_flag():
    assert (triage_limit("off"), triage_limit("AUTO"), triage_limit("5")) == (0, 12, 5)
    for bad in ("0", "-1", "lots", "1001"):
        with pytest.raises(ConfigError, match="--triage takes off, auto"):
            triage_limit(bad)
    with pytest.raises(ConfigError, match="--recheck compares greedy answers"):
        RunConfig(url="http://h/v1", recheck=0.5, temperature=0.7)
    with pytest.raises(ConfigError, match="from 0 \\(off\\) to 1"):
        RunConfig(url="http://h/v1", recheck=1.5)


def test_findings_kept_cover_every_code_and_scenario_first():
    keep = FindingKeep(3)
    leak = [Verdict("dsml_leak_content", "x")]
    for i in range(5):
        keep.note(_headers(f"s{i}", 1), _body(f"leak {i}"), leak)
    keep.note(_headers("s9", 1, "ops"), _body("ops leak"), leak)
    keep.note(_headers("s8", 2), _body("bad args"), [Verdict("args_not_json", "x")])
    chosen = keep.chosen()
    assert len(chosen) == 3
    assert {(k.codes[0], k.scenario) for k in chosen} == {
        ("dsml_leak_content", "coding"),
        ("dsml_leak_content", "ops"),
        ("args_not_json", "coding"),
    }


def test_what_is_not_kept_for_triage():
    keep = FindingKeep(12)
    keep.note(_headers("s0", 1), _body("a", temperature=0.7), [Verdict("dsml_leak_content", "x")])  # not greedy
    keep.note(_headers("s1", 1), _body("b"), [Verdict("reference_mismatch", "x")])  # judged against another answer
    keep.note(_headers("s2", 1), _body("c"), [Verdict("markup_unproven", "x")])  # evidence only
    keep.note(_headers("s3", 1), _body("d"), [Verdict("empty_turn", "x")])
    keep.note(_headers("s4", 1), _body("d"), [Verdict("empty_turn", "x")])  # the same request again
    assert [k.session for k in keep.chosen()] == ["s3"]
    assert FindingKeep(0).chosen() == []


def test_the_kept_body_is_the_request_as_sent():
    keep = FindingKeep(12)
    body = _body("x")
    keep.note(_headers("s0", 1), body, [Verdict("empty_turn", "x")])
    body["messages"].append({"role": "assistant", "content": "later"})  # the session goes on
    assert len(keep.chosen()[0].body["messages"]) == 1


def test_the_cold_request_shares_no_prefix_and_leaves_the_original_alone():
    with_system = {"messages": [{"role": "system", "content": "You are"}, {"role": "user", "content": "hi"}]}
    cold = cold_body(with_system, "abc")
    assert cold["messages"][0]["content"] == "[dsv4bench triage abc]\nYou are" and len(cold["messages"]) == 2
    assert with_system["messages"][0]["content"] == "You are"
    cold = cold_body(_body("hi"), "abc")
    assert cold["messages"][0] == {"role": "system", "content": "[dsv4bench triage abc]"}
    assert request_key(cold_body(_body("hi"), "a")) != request_key(cold_body(_body("hi"), "b"))


def test_recheck_keeps_every_scenario_and_depth_then_a_share():
    resp = AssembledResponse(content="ok", finish_reason="stop")
    keep = RecheckKeep(0.0001, seed=1)
    for s in range(50):
        for turn in range(3):
            keep.note(_headers(f"s{s}", turn, "coding" if s % 2 else "ops"), _body(f"{s}/{turn}"), resp, [])
    assert keep.seen == 150 and keep.strata == {(sc, t) for sc in ("coding", "ops") for t in range(3)}
    assert len(keep.kept) == 6  # one of each pair: the share draws almost nothing more
    assert {k.session for k in keep.kept} <= {"s48", "s49"}  # each pair's latest turn
    half = RecheckKeep(0.5, seed=1)
    for s in range(200):
        half.note(_headers(f"s{s}", 0), _body(str(s)), resp, [])
    assert 70 < len(half.kept) < 130
    full = RecheckKeep(1.0, seed=1)
    for s in range(RECHECK_MAX + 10):
        full.note(_headers(f"s{s}", 0), _body(str(s)), resp, [])
    # the latest are kept and sent first: cache state builds up as the load goes on
    sessions = [k.session for k in full.kept]
    assert len(sessions) == RECHECK_MAX and sessions[0] == f"s{RECHECK_MAX + 9}" and "s9" not in sessions
    assert sessions == sorted(sessions, key=lambda x: -int(x[1:]))
    skipped = RecheckKeep(1.0, seed=1)
    skipped.note(_headers("s0", 0), _body("x"), resp, [Verdict("empty_turn", "x")])  # a finding: triage's
    skipped.note(_headers("s1", 0), _body("y", temperature=1), resp, [])  # not greedy
    assert skipped.kept == [] and RecheckKeep(0.0, 1).kept == []


def test_an_answer_changed_under_load_and_one_that_did_not():
    calls = (("read_file", '{"path": "a.py"}'),)
    load = ReferenceAnswer("Looking.", "", calls, "tool_calls")
    assert changed_verdict(load, ReferenceAnswer("Looking.", "", calls, "tool_calls")) is None
    other = ReferenceAnswer("Looking.", "", (("read_file", '{"path": "b.py"}'),), "tool_calls")
    v = changed_verdict(load, other)
    assert v is not None and v.code == "answer_changed_under_load" and v.where == "tool_calls[0].arguments"
    assert "alone after the load" in v.detail


def test_each_comparison_code_reads_only_its_own_kind_of_answer():
    from dsv4bench.checks import run_checks
    from dsv4bench.checks.reference import AloneAnswer
    from dsv4bench.history.records import TurnContext

    resp = AssembledResponse(content="Done here.", finish_reason="stop")
    alone, ref = AloneAnswer("Done.", "", (), "stop"), ReferenceAnswer("Done.", "", (), "stop")
    codes = {
        c: {v.code for v in run_checks(TurnContext(response=resp, tools={}, reference=c))[0]} for c in (alone, ref)
    }
    assert codes[alone] == {"answer_changed_under_load"} and codes[ref] == {"reference_mismatch"}
    same = TurnContext(response=resp, tools={}, reference=AloneAnswer("Done here.", "", (), "stop"))
    assert run_checks(same)[0] == []


class _Sender:
    """Answers recheck's sends from a script: one answer text per send; notes each send's purpose,
    and the most requests it had in flight at once, and whether an alone one had company."""

    def __init__(self, *texts: str, differ: frozenset[str] = frozenset(), crowd: int = 0) -> None:
        self.texts = list(texts)
        self.differ = differ  # sessions answered "Other." on every send, where no script is given
        self.crowd = crowd  # >0: "Other." where more than this many were in flight (a race under load)
        self.purposes: list[str] = []
        self.in_flight: list[str] = []
        self.most_in_flight = 0
        self.alone_had_company = False

    async def send(self, kept, purpose):
        import anyio

        from dsv4bench.harness.triage import Sent
        from dsv4bench.wire.turn_answer import TurnOutcome
        from dsv4bench.history.records import Timings, TurnStatus

        self.purposes.append(purpose)
        self.in_flight.append(purpose)
        self.most_in_flight = max(self.most_in_flight, len(self.in_flight))
        text = self.texts.pop(0) if self.texts else "Other." if kept.session in self.differ else "Same."
        company = len(self.in_flight)  # as the request arrives, and as it ends (the fixture's way)
        await anyio.sleep(0.01)
        if self.crowd and max(company, len(self.in_flight)) > self.crowd:
            text = "Other."
        if "recheck" in self.in_flight and len(self.in_flight) > 1:
            self.alone_had_company = True
        self.in_flight.remove(purpose)
        response = AssembledResponse(content=text, finish_reason="stop")
        return Sent(TurnOutcome(TurnStatus.OK, Timings(start_ns=0, start_wall_ns=0), response=response), frozenset())


@pytest.mark.parametrize(
    ("sends", "cls", "screen_only"),
    [
        (("Same.",), None, 0),  # the screen gives the load's answer: one request, no finding
        (("Other.", "Same."), None, 1),  # only the group's answer differed: alone it is the load's
        (("Other.", "Other.", "Other."), "load_dependent", 0),
        (("Other.", "Other.", "Third."), "cache_state", 0),
        (("Other.", "Other.", "Same."), "cache_state", 0),  # the first read what the load left; then the load's
    ],
)
def test_recheck_confirms_alone_only_where_the_screen_differs(sends, cls, screen_only):
    import anyio

    from dsv4bench.harness.recheck import RecheckGate, recheck_one
    from dsv4bench.harness.triage import Kept

    sender = _Sender(*sends)
    kept = Kept(_headers("s1", 3), _body("x"), ReferenceAnswer("Same.", "", (), "stop"))
    gate = RecheckGate()
    found = anyio.run(recheck_one, sender, kept, gate)
    assert sender.texts == []  # every scripted send was made, and no more
    assert sender.purposes == ["recheck_screen"] + ["recheck"] * (len(sends) - 1)
    assert (found.cls if found else None) == cls and gate.screen_only == screen_only
    if found:
        assert found.verdict.code == "answer_changed_under_load"


def test_screens_share_the_server_and_a_confirmation_has_it_alone():
    import anyio

    from dsv4bench.harness.recheck import RecheckGate, recheck_one
    from dsv4bench.harness.triage import Kept

    # every fifth session's answer differs, and is then confirmed alone twice
    sender = _Sender(differ=frozenset(f"s{i}" for i in range(20) if i % 5 == 2))
    gate = RecheckGate()
    found: list = []

    async def main() -> None:
        async def one(i: int) -> None:
            await anyio.sleep(i * 0.001)
            kept = Kept(_headers(f"s{i}", 1), _body(str(i)), ReferenceAnswer("Same.", "", (), "stop"))
            found.append(await recheck_one(sender, kept, gate))

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)

    anyio.run(main)
    assert sender.most_in_flight > 1  # the screens overlapped
    assert not sender.alone_had_company  # no confirmation shared the server
    assert sender.purposes.count("recheck") == 8 and sum(f is not None for f in found) == 4


@pytest.mark.parametrize(("group", "found"), [(8, 0), (1, 8)])
def test_a_change_within_the_screens_group_hides_and_one_at_a_time_finds_it(group, found):
    import anyio

    from dsv4bench.harness.recheck import RecheckGate, recheck_one
    from dsv4bench.harness.triage import Kept

    # The load's answer was "Other.": the server answers so whenever 2 or more are in flight.
    sender = _Sender(crowd=1)
    gate = RecheckGate()
    changed: list = []

    async def main() -> None:
        async def one(i: int) -> None:
            kept = Kept(_headers(f"s{i}", 1), _body(str(i)), ReferenceAnswer("Other.", "", (), "stop"))
            changed.append(await recheck_one(sender, kept, gate))

        for wave in range(0, 8, group):  # `group` at once, as alone.py's workers send them
            async with anyio.create_task_group() as tg:
                for i in range(wave, wave + group):
                    tg.start_soon(one, i)

    anyio.run(main)
    assert sum(c is not None for c in changed) == found  # the documented trade-off (docs/triage.md)
    assert all(c.cls == "load_dependent" for c in changed if c is not None)


def test_recheck_sends_a_session_at_a_time_by_depth():
    resp = AssembledResponse(content="ok", finish_reason="stop")
    keep = RecheckKeep(1.0, seed=1)
    for turn in range(3):  # sessions interleave as a load answers them
        for s in range(4):
            keep.note(_headers(f"s{s}", turn), _body(f"{s}/{turn}"), resp, [])
    order = [(k.session, k.turn) for k in keep.kept]
    # s3 answered last: its session first, each session's turns by depth
    assert order[:3] == [("s3", 0), ("s3", 1), ("s3", 2)]
    assert sorted(order) == sorted((f"s{s}", t) for s in range(4) for t in range(3))
    for s in range(4):
        turns = [t for sess, t in order if sess == f"s{s}"]
        assert turns == [0, 1, 2]
    sessions = [sess for sess, _ in order]
    assert sessions == sorted(sessions, key=sessions.index)  # each session's turns together


def test_triage_cut_by_the_time_cap_keeps_every_finding_triaged_before_the_cut():
    """At 1,000 findings `--triage 1000` runs into the 120 s cap: what it triaged by then is
    reported, not dropped with the ones it never reached."""
    import anyio

    from dsv4bench.harness.triage import Kept, Sent, Triaged, triage_findings
    from dsv4bench.history.records import Timings, TurnStatus
    from dsv4bench.wire.turn_answer import TurnOutcome

    class SlowLeaks:
        sent = 0

        async def send(self, kept, purpose, body=None, raw=False):
            self.sent += 1
            await anyio.sleep(0.01)
            response = AssembledResponse(content="<｜DSML｜invoke", finish_reason="stop")
            outcome = TurnOutcome(TurnStatus.OK, Timings(start_ns=0, start_wall_ns=0), response=response)
            return Sent(outcome, frozenset({"dsml_leak_content"}))

    kept = [Kept(_headers(f"s{i}", 1), _body(f"x{i}"), codes=("dsml_leak_content",)) for i in range(50)]
    out: list[Triaged] = []
    sender = SlowLeaks()

    async def capped() -> None:
        with anyio.move_on_after(0.2):  # 4 sends a finding at 10 ms: about 5 findings
            await triage_findings(sender, kept, True, False, out)

    anyio.run(capped)
    assert 2 <= len(out) < len(kept) and sender.sent >= 4 * len(out)
    assert all(t.cls == "deterministic" for t in out)
