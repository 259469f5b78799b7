"""The agent session core, sans-IO: given the last response, produce the next request.

A session owns a scenario world and the chat transcript. The driver asks it for a request
body, sends it however it likes (anyio + httpx, Locust, a test), and hands back the
assembled response with the checkers' verdicts. The session runs the tool calls against
its world and appends the results, exactly as a real coding agent's loop does.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from dsv4bench.agents.base import ScenarioFamily, ToolError, World, format_tool_error
from dsv4bench.agents.call_gate import CallGate
from dsv4bench.agents.transcript import (
    CallText,
    assistant_message,
    default_call_id,
    opening_messages,
    tool_message,
    transcript_chars,
)
from dsv4bench.errors import UsageError
from dsv4bench.history.records import CORRUPTION_CODES, REFERENCE_CODE, AssembledResponse, TurnStatus, Verdict
from dsv4bench.harness.reference_run import SessionKeys, request_key
from dsv4bench.harness.context_profile import SHORT, ContextProfile
from dsv4bench.harness.opening_reads import opening_reads
from dsv4bench.harness.request_mix import RequestMix, apply
from dsv4bench.history.request_terms import RequestTerms


class SessionState(str, enum.Enum):
    READY = "ready"  # next_request() may be called
    AWAITING = "awaiting"  # a request is out; observe() comes next
    DONE = "done"


class EndReason(str, enum.Enum):
    FINAL = "final"  # the model gave a final answer
    MAX_TURNS = "max_turns"
    CORRUPT = "corrupt"  # stopped on a corrupt turn (on_corrupt="stop")
    ERROR = "error"  # HTTP error, timeout or connection failure
    KILLED = "killed"  # the nemesis killed it
    DURATION = "duration"  # the run's time was up
    CONTEXT_FULL = "context_full"  # the next turn would not fit the server's context
    DEPTH_REACHED = "depth_reached"  # the next turn would pass the depth its context profile drew


ON_CORRUPT_CHOICES = ("continue", "stop")


class SessionConfigError(UsageError, ValueError):
    """A SessionConfig field that cannot work: `field` names it, so that a caller can name it
    as its user knows it (RunConfig: the flag)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class SessionConfig:
    """How every session of a run talks to the server: the one place these settings' defaults
    and checks stand (RunConfig and the `agents` flags read them from here)."""

    model: str
    max_turns: int = 12
    thinking: bool = False
    stream: bool = True
    max_tokens: int = 1024
    temperature: float = 0.0
    # What the agent does after a corrupt turn: "continue" (feed back an error, as real agents
    # do) or "stop" (end the session).
    on_corrupt: str = "continue"
    # The server's context in tokens (None: unknown). A session whose next request would not fit
    # ends there, as an agent framework stops or compacts its history, instead of sending a
    # request the server must refuse: a refusal of an oversized prompt is not the server's fault.
    context_tokens: int | None = None
    # --request-mix: each turn's tool_choice, parallel_tool_calls, thinking and stop drawn from
    # it (request_mix.py); None: every turn asks the same (auto, `thinking` above).
    request_mix: RequestMix | None = None
    # --context: each session's deepest prompt drawn from recorded agents' (context_profile.py),
    # reached by opening with reads of its world; the short profile opens with none.
    context_profile: ContextProfile = SHORT
    # Ask where each turn's cached prompt tokens came from, device or host (SGLang's
    # `return_cached_tokens_details`, answered as `sglext.cached_tokens_details`): only SGLang's
    # kinds know the field, and a strict server could refuse it.
    cache_tiers: bool = False

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise SessionConfigError("max_turns", "must be at least 1")
        if self.max_tokens < 1:
            raise SessionConfigError("max_tokens", "must be at least 1")
        if self.on_corrupt not in ON_CORRUPT_CHOICES:
            raise SessionConfigError("on_corrupt", "must be 'continue' or 'stop'")
        if self.context_tokens is not None and self.context_tokens < 1:
            raise SessionConfigError("context_tokens", "must be at least 1")
        if self.thinking and self.request_mix is not None and "thinking" in self.request_mix.varies:
            raise SessionConfigError("thinking", "is drawn per turn by the request mix: drop one of the two")


# Bounds for the next prompt's size from the last turn's usage: every character added since
# counts as half a token (BPE vocabularies average 3-4 characters per token on these tool
# results), plus a few tokens of chat markup per message. Over-estimating ends a session a turn
# early; under-estimating would send a request the server refuses.
_CHARS_PER_TOKEN_FLOOR = 2
_TOKENS_PER_MESSAGE = 16

# What a real agent framework sends back when the model's output could not be used.
_NUDGE_MALFORMED = (
    "Your last reply could not be used: {why}. Call the tools with valid JSON arguments "
    "that match their schemas, or give your final answer."
)


class AgentSession:
    """One multi-turn tool-calling conversation against one virtual world."""

    def __init__(
        self, session_id: str, family: ScenarioFamily, seed: int, config: SessionConfig, world: World | None = None
    ) -> None:
        """`world`: `family.build_world(seed)`'s, built already (`in_steps`); None: built here."""
        self.session_id = session_id
        self.family = family
        self.seed = seed
        self.config = config
        self.world = family.build_world(seed) if world is None else world
        self.task = family.make_task(self.world, seed)
        self.tools = family.openai_tools()
        self.keys = SessionKeys()  # request_key of this session's requests
        self.schemas = family.tool_schemas()
        self.gate = CallGate(self.schemas)
        self.messages: list[dict[str, Any]] = opening_messages(family.system_prompt, self.task.prompt)
        # The depth this session grows to (None: its own growth only), within the server's context.
        self.depth_limit = config.context_profile.depth_for(seed)
        if self.depth_limit is not None:
            self.messages += self._opening(config, self.depth_limit)
            if config.context_tokens is not None:
                self.depth_limit = min(self.depth_limit, config.context_tokens)
        self.turn = 0
        self.tool_calls_run = 0
        self.state = SessionState.READY
        self.end_reason: EndReason | None = None
        self._thinking_sent = config.thinking  # whether the request out asked for thinking
        self._tokens_used: int | None = None  # prompt + completion tokens of the last turn, as reported
        self._messages_counted = 0  # messages the reported usage covers

    def _opening(self, config: SessionConfig, depth: int) -> list[dict[str, Any]]:
        """The reads a session of `depth` tokens opens with: its profile's share of the depth less
        what the system prompt, task and tools take, and never more than lets its first request
        (with max_tokens) fit the server's context at the fewest characters a token takes."""
        fixed = -(-(transcript_chars(self.messages) + len(json.dumps(self.tools))) // _CHARS_PER_TOKEN_FLOOR)
        budget = config.context_profile.opening_chars(depth - fixed, self.family.name)
        if config.context_tokens is not None:
            room = config.context_tokens - config.max_tokens - fixed - _TOKENS_PER_MESSAGE
            budget = min(budget, max(0, room) * _CHARS_PER_TOKEN_FLOOR)
        return opening_reads(self.family.name, self.world, self.gate, budget)

    @classmethod
    def in_steps(
        cls, session_id: str, family: ScenarioFamily, seed: int, config: SessionConfig
    ) -> Generator[None, None, AgentSession]:
        """The session the constructor makes, its world built in steps (agents.base.Steps): the
        driver runs each step in its own pass of the loop."""
        world = yield from family.build_world_steps(seed)
        return cls(session_id, family, seed, config, world)

    def next_request(self) -> dict[str, Any]:
        """The chat-completions body for the next turn."""
        assert self.state is SessionState.READY, f"next_request in state {self.state}"
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": list(self.messages),
            "tools": self.tools,
            "tool_choice": "auto",
            "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature,
            "stream": self.config.stream,
            "chat_template_kwargs": {"thinking": self.config.thinking},
            "user": self.session_id,
        }
        if self.config.stream:
            body["stream_options"] = {"include_usage": True}
        if self.config.cache_tiers:
            body["return_cached_tokens_details"] = True
        if self.config.request_mix is not None:
            apply(body, self.config.request_mix.draw(self.seed, self.turn, list(self.schemas)))
        self._thinking_sent = bool(RequestTerms.of_body(body).thinking)
        self.state = SessionState.AWAITING
        return body

    def observe(self, status: TurnStatus, response: AssembledResponse | None, verdicts: list[Verdict]) -> None:
        """Take the outcome of the request from next_request() and advance the conversation."""
        assert self.state is SessionState.AWAITING, f"observe in state {self.state}"
        self.turn += 1
        if status is TurnStatus.KILLED:
            return self._end(EndReason.KILLED)
        if status is not TurnStatus.OK or response is None:
            return self._end(EndReason.ERROR)
        corrupt = [v for v in verdicts if v.code in CORRUPTION_CODES]
        if corrupt and self.config.on_corrupt == "stop":
            return self._end(EndReason.CORRUPT)
        calls = [
            CallText(c.id or default_call_id(self.turn, c.index), c.name or "", c.arguments)
            for c in response.tool_calls
        ]
        # DeepSeek-V4 wants a thinking turn's reasoning back with its tool results.
        self.messages.append(
            assistant_message(response.content, calls, reasoning=response.reasoning, with_reasoning=self._thinking_sent)
        )
        self._note_usage(response)
        if calls:
            for call in calls:
                self._run_tool_call(call.id, call.name, call.arguments)
        elif unusable := [v for v in corrupt if v.code != REFERENCE_CODE]:
            # The reply was unusable (leaked markup, empty, truncated...): say so and go on. A
            # reply that only differs from the reference run's is well formed: the agent uses it.
            why = ", ".join(sorted({v.code for v in unusable}))
            self.messages.append({"role": "user", "content": _NUDGE_MALFORMED.format(why=why)})
        else:
            return self._end(EndReason.FINAL)
        if self.turn >= self.config.max_turns:
            return self._end(EndReason.MAX_TURNS)
        if (prompt := self._next_prompt_estimate()) is not None:
            context = self.config.context_tokens
            if context is not None and prompt + self.config.max_tokens > context:
                return self._end(EndReason.CONTEXT_FULL)
            if self.depth_limit is not None and prompt > self.depth_limit:  # a depth bounds the prompt only
                return self._end(EndReason.DEPTH_REACHED)
        self.state = SessionState.READY

    def _note_usage(self, response: AssembledResponse) -> None:
        usage = response.usage or {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            self._tokens_used, self._messages_counted = prompt + completion, len(self.messages)
        else:  # no usage this turn: no bound
            self._tokens_used = None

    def _next_prompt_estimate(self) -> int | None:
        """The next prompt's tokens at most (or nearly): the last turn's as reported, plus what
        was added since; None where the last turn reported no usage (no bound)."""
        if self._tokens_used is None:
            return None
        added = self.messages[self._messages_counted :]
        chars = sum(len(str(m.get("content") or "")) for m in added)
        return self._tokens_used + -(-chars // _CHARS_PER_TOKEN_FLOOR) + _TOKENS_PER_MESSAGE * len(added)

    def stop(self, reason: EndReason) -> None:
        """End the session from outside (the run's time is up, the nemesis killed it)."""
        self._end(reason)

    def _run_tool_call(self, call_id: str, name: str, raw_args: str) -> None:
        """Execute one call against the world; bad calls get an error result, as agents do."""
        args, refusal = self.gate.check(name, raw_args)
        result = refusal if args is None else self._execute(name, args)
        self.messages.append(tool_message(call_id, result))

    def _execute(self, name: str, args: dict[str, Any]) -> str:
        try:
            result = self.world.execute(name, args)
        except ToolError as e:
            return format_tool_error(e)
        self.tool_calls_run += 1
        return result

    def _end(self, reason: EndReason) -> None:
        self.state = SessionState.DONE
        self.end_reason = reason

    @property
    def done(self) -> bool:
        return self.state is SessionState.DONE


def request_summary(body: dict[str, Any], keys: SessionKeys | None = None) -> dict[str, Any]:
    """What turns.jsonl keeps of a request: its shape and key (dsv4bench/harness/reference_run.py), not its
    (large) transcript. `keys`: the session's, which keeps its transcript's encoding between turns."""
    msgs = body.get("messages") or []
    return {
        "key": request_key(body) if keys is None else keys.key(body),
        "temperature": body.get("temperature"),
        "messages": len(msgs),
        "prompt_chars": sum(len(str(m.get("content") or "")) for m in msgs),
        "tools": len(body.get("tools") or []),
        "stream": bool(body.get("stream")),
        "max_tokens": body.get("max_tokens"),
        "terms": RequestTerms.of_body(body).to_json(),  # tool_choice, thinking, stop...
    }
