"""`OpenAIRequest`: a checked chat or completion request (what frontend.py makes) together with
the SGLang extensions of the answer it asked for.

SGLang's ChatCompletionRequest and CompletionRequest take `return_cached_tokens_details`; set,
the answer carries SGLang's `sglext` object with the request's cached prompt tokens split by
tier (outputs.py `cached_tokens_details`). Unset, the answer is plain OpenAI, as SGLang's is.
"""

from __future__ import annotations

from dataclasses import dataclass

from .prepared_request import PreparedRequest


@dataclass
class OpenAIRequest(PreparedRequest):
    """A `PreparedRequest` of the OpenAI endpoints."""

    return_cached_tokens_details: bool = False


def wants_cached_tokens_details(req: PreparedRequest) -> bool:
    """Whether `req` asked for `sglext.cached_tokens_details` (a request made elsewhere than the
    OpenAI front end, a `/generate` one say, never did)."""
    return isinstance(req, OpenAIRequest) and req.return_cached_tokens_details
