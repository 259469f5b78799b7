"""--request-mix: per turn, a seeded draw of what the request asks of its answer, as agent
frameworks vary it: tool_choice, parallel_tool_calls, thinking with its reasoning_effort, stop
sequences. What each draw means for the answer is checked by checks/request_compliance.py; the
report splits every code by the drawn variant (request_terms.RequestTerms.variant).

The spec: a preset name, then `;`-separated dimensions, each `name=value[:weight],...` (weight
1 where left out), replacing the preset's weights for that dimension:

    frameworks                                      the default mix (below)
    tool_choice=auto:6,none:2,required:1,named:1    only tool_choice varies
    frameworks;thinking=off                         the default mix, thinking never on

`frameworks` weighs what common agent frameworks send to an OpenAI-compatible server (an estimate
from their defaults, not a measurement): most turns `auto` (every framework's default), some
`required` (a loop that forces a tool step), a named function (structured output: LangChain's
`with_structured_output`, the OpenAI Agents SDK's forced tools), `none` (a framework asking for
the final summary); `parallel_tool_calls` mostly not sent, else true or false (LangChain,
the Agents SDK); thinking off on most turns, else on at DeepSeek's tiers; the stop sequence
ReAct-style agents send (LangChain's ReAct, CrewAI) on a few.

Thinking mode refuses a `required` or named tool_choice (DeepSeek-V4 answers 400), so a
thinking turn draws its tool_choice among `auto` and `none` only.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsv4bench.errors import UsageError
from dsv4bench.history.request_terms import DIMENSIONS, NAMED, RequestTerms

THINKING_VALUES = ("off", "on", "low", "high", "xhigh", "max")  # on: thinking, no reasoning_effort
VALUES: dict[str, tuple[str, ...]] = {
    "tool_choice": ("auto", "required", "none", NAMED),
    "parallel_tool_calls": ("unset", "true", "false"),
    "thinking": THINKING_VALUES,
    "stop": ("none", "set"),
}
assert tuple(VALUES) == DIMENSIONS
# What "stop=set" sends: the observation marker ReAct-style agents stop at.
STOP_SEQUENCES = ("\nObservation:",)
_THINKING_CHOICES = ("auto", "none")  # what thinking mode allows

Weights = tuple[tuple[str, float], ...]

PRESETS: dict[str, dict[str, Weights]] = {
    "frameworks": {
        "tool_choice": (("auto", 70), ("required", 10), (NAMED, 10), ("none", 10)),
        "parallel_tool_calls": (("unset", 60), ("true", 20), ("false", 20)),
        "thinking": (("off", 60), ("on", 10), ("low", 10), ("high", 10), ("max", 10)),
        "stop": (("none", 85), ("set", 15)),
    },
}
DEFAULT_PRESET = "frameworks"


class RequestMixError(UsageError, ValueError):
    """A --request-mix spec that cannot be drawn from; the message says what to write."""


@dataclass(frozen=True)
class RequestMix:
    """Weights per dimension; a dimension left out is never varied (the session's own value)."""

    weights: tuple[tuple[str, Weights], ...]
    spec: str = ""

    @classmethod
    def parse(cls, spec: str) -> RequestMix:
        parts = [p.strip() for p in spec.split(";") if p.strip()]
        if not parts:
            raise RequestMixError("is empty: give a preset (" + ", ".join(PRESETS) + ") or name=value:weight,...")
        chosen: dict[str, Weights] = {}
        for i, part in enumerate(parts):
            if "=" not in part:
                if i or part not in PRESETS:
                    raise RequestMixError(
                        f"{part!r} is neither a preset ({', '.join(PRESETS)}, first only) nor name=value:weight,..."
                    )
                chosen.update(PRESETS[part])
                continue
            name, _, values = (x.strip() for x in part.partition("="))
            if name not in VALUES:
                raise RequestMixError(f"{name!r} is not a dimension (one of {', '.join(VALUES)})")
            chosen[name] = _weights(name, values)
        thinking = dict(chosen.get("thinking", ()))
        choices = dict(chosen.get("tool_choice", ()))
        if (
            any(w > 0 for v, w in thinking.items() if v != "off")
            and choices
            and not any(choices.get(c, 0) > 0 for c in _THINKING_CHOICES)
        ):
            raise RequestMixError(
                "draws thinking turns but only tool_choice values thinking mode refuses "
                "(required, named): give auto or none some weight"
            )
        return cls(tuple((d, chosen[d]) for d in DIMENSIONS if d in chosen), spec)

    @property
    def varies(self) -> tuple[str, ...]:
        return tuple(d for d, _ in self.weights)

    def draw(self, seed: int, turn: int, tool_names: Sequence[str]) -> dict[str, str]:
        """The variant of `seed`'s session at `turn`: the same for the same seed, turn and mix."""
        rng = random.Random(f"request-mix:{seed}:{turn}")
        got = {d: _pick(rng, w) for d, w in self.weights if d != "tool_choice"}
        weights = dict(self.weights).get("tool_choice")
        if weights is not None:
            if got.get("thinking", "off") != "off":
                weights = tuple((v, w) for v, w in weights if v in _THINKING_CHOICES)
            if not tool_names:
                weights = tuple((v, w) for v, w in weights if v != NAMED) or (("auto", 1.0),)
            got["tool_choice"] = _pick(rng, weights)
            if got["tool_choice"] == NAMED:
                got["named_tool"] = rng.choice(list(tool_names))
        return got


def apply(body: dict[str, Any], drawn: dict[str, str]) -> None:
    """Write a drawn variant into a chat body, as the frameworks send each value."""
    choice = drawn.get("tool_choice")
    if choice is not None:
        body["tool_choice"] = RequestTerms(tool_choice=choice, named_tool=drawn.get("named_tool")).tool_choice_body()
    parallel = drawn.get("parallel_tool_calls")
    if parallel in ("true", "false"):
        body["parallel_tool_calls"] = parallel == "true"
    thinking = drawn.get("thinking")
    if thinking is not None:
        body["chat_template_kwargs"] = {**body.get("chat_template_kwargs", {}), "thinking": thinking != "off"}
        if thinking not in ("off", "on"):
            body["reasoning_effort"] = thinking
    if drawn.get("stop") == "set":
        body["stop"] = list(STOP_SEQUENCES)


def _weights(name: str, text: str) -> Weights:
    out: list[tuple[str, float]] = []
    for item in (x.strip() for x in text.split(",")):
        value, _, weight = (x.strip() for x in item.partition(":"))
        if value not in VALUES[name]:
            raise RequestMixError(f"{name}={value!r}: not one of {', '.join(VALUES[name])}")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise RequestMixError(f"{name}={value}:{weight!r}: the weight must be a number") from None
        if not w >= 0 or w == float("inf"):
            raise RequestMixError(f"{name}={value}:{weight}: the weight must be a finite number of at least 0")
        out.append((value, w))
    if not any(w > 0 for _, w in out):
        raise RequestMixError(f"{name}: no value has a weight above 0")
    return tuple(out)


def _pick(rng: random.Random, weights: Weights) -> str:
    values = [v for v, w in weights if w > 0]
    return rng.choices(values, [w for _, w in weights if w > 0])[0]
