"""DSV4-mini evaluated as an agent through a real server (scripts/eval_engine.py): held-out
seeds, greedy decoding, one session at a time, every turn judged by the harness's checkers."""

from __future__ import annotations

from collections import Counter

import httpx

from ...agents import FAMILIES
from ...client import Deadlines, TurnOutcome
from ...driver import play_session
from ...records import TurnStatus, Verdict
from ...session import AgentSession, EndReason, SessionConfig

BAD_CALL = {"args_not_json", "schema_violation", "unknown_tool", "dsml_in_arguments", "special_token_leak"}


async def eval_family(url: str, family: str, seeds: range, max_turns: int, context: int | None) -> dict:
    """One family's `seeds` played at `url`: counts of turns, valid tool-call turns, DSML-clean turns,
    finished and solved sessions, verdict codes, and every flagged turn."""
    fam = FAMILIES[family]
    c: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    bad_turns: list[dict] = []
    async with httpx.AsyncClient(timeout=300, trust_env=False) as client:
        for seed in seeds:
            config = SessionConfig(model="dsv4-mini", max_turns=max_turns, context_tokens=context)
            sess = AgentSession(f"eval-{family}-{seed}", fam, seed, config)

            def tally(out: TurnOutcome, verdicts: list[Verdict]) -> None:
                got = {v.code for v in verdicts}
                codes.update(got)
                if got:
                    bad_turns.append(
                        {
                            "seed": seed,
                            "turn": sess.turn,
                            "verdicts": [v.to_json() for v in verdicts],
                            "tool_calls": [tc.to_json() for tc in (out.response.tool_calls if out.response else [])],
                        }
                    )
                c["turns"] += 1
                c["turns_errored"] += out.status is not TurnStatus.OK
                c["dsml_clean"] += not any(code.startswith("dsml_") for code in got)
                if out.response and out.response.tool_calls:
                    c["call_turns"] += 1
                    c["call_turns_valid"] += not (got & BAD_CALL or any(x.startswith("dsml_") for x in got))

            await play_session(client, url, sess, Deadlines(120, 300), tally)
            c["sessions"] += 1
            c["final"] += sess.end_reason is EndReason.FINAL
            c["solved"] += bool(fam.solved(sess.task, sess.world))
    return {"family": family, **c, "codes": dict(codes), "bad_turns": bad_turns}
