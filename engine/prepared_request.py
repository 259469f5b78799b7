"""`PreparedRequest`: a chat or completion request the front end (frontend.py) has checked and
rendered to prompt tokens; the engine generates from it and the outputs (outputs.py) turn the
engine's tokens back into its response."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import deepseek_recipe as dr

from .request import SamplingParams


@dataclass(frozen=True)
class Bootstrap:
    """Where a PD request's KV meets (SGLang's `bootstrap_host`, `bootstrap_port` and
    `bootstrap_room`, which a PD router adds to the body it sends both servers): the prefill
    server's bootstrap port, and the room, a random 63-bit id shared by the two halves."""

    host: str
    port: int
    room: int


@dataclass
class PreparedRequest:
    """A validated request, ready for `engine.generate(rid, prompt_ids, params)`."""

    rid: str  # chatcmpl-... / cmpl-...: the response id is the engine rid
    model: str  # echoed in responses, as SGLang does
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    thinking: bool = False
    conversation: dr.ConversationRequest | None = None  # chat only
    skip_special_tokens: bool = True  # completion only
    stop: tuple[str, ...] = ()  # completion only; chat stop strings live in the recipe parser
    created: int = field(default_factory=lambda: int(time.time()))
    bootstrap: Bootstrap | None = None  # a PD router's request to a prefill or decode server
