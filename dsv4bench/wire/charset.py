"""The text of a body in the charset its server names.

httpx takes any codec name Python knows from a Content-Type (`charset=zlib`, `rot13`,
`utf-16` with no BOM), and the codec then fails on the body each in its own way
(AssertionError, TypeError, UnicodeError): whatever reads a server's body as text reads it
through here, so a server's odd charset is a recorded answer, never a harness crash.
"""

from __future__ import annotations

import codecs

import httpx


class Charset:
    """A streamed body's charset as an incremental decoder, undecodable bytes replaced. A codec
    that cannot read the body fails as httpx fails a body it cannot decode (gzip), with its
    DecodingError: the turn's connection_error, never the codec's own exception."""

    def __init__(self, charset: str | None) -> None:
        self.name = charset or "utf-8"
        try:
            self._decoder = codecs.getincrementaldecoder(self.name)(errors="replace")
        except Exception as e:  # each codec fails in its own way (see decode)
            raise self._failed(e) from e

    def decode(self, data: bytes, final: bool = False) -> str:
        try:
            text: str = self._decoder.decode(data, final)
        except Exception as e:  # AssertionError, TypeError, UnicodeError, ...: the codec's
            raise self._failed(e) from e
        return text

    def _failed(self, e: Exception) -> httpx.DecodingError:
        return httpx.DecodingError(f"the body does not decode as charset {self.name!r}: {type(e).__name__}: {e}"[:300])


def response_text(response: httpx.Response) -> str:
    """A read response's text as `response.text` gives it; where its charset cannot read it, the
    body read as UTF-8, undecodable bytes replaced (a metrics page or an error's message is
    still worth reading)."""
    try:
        return response.text
    except Exception:  # noqa: BLE001 - AssertionError, TypeError, UnicodeError: whichever the codec raises
        return response.content.decode("utf-8", "replace")
