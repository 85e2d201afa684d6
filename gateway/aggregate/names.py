"""What ``POST /mcp`` calls things: exposed names and URIs, and its own cursors.

Tools and prompts are exposed as ``<member><separator><name>`` (MCP 2026-07-28, server/tools,
'Tool Names': an aggregating proxy should disambiguate by a server prefix); resource URIs and
URI templates as ``mcp-gateway:<member>/<uri>``, itself a URI (RFC 3986: scheme ``mcp-gateway``,
the member name and the member's URI as its path), so that a read of a listed URI, or of one
expanded from a listed template (RFC 6570 touches only the ``{...}`` expressions), names its member.

Cursors (MCP 2026-07-28, server/utilities/pagination): the gateway pages the aggregate itself;
a cursor is the page's number and a fingerprint of the whole list it is a page of, so that a
cursor of a list that has since changed is told from a good one. Nothing in it is secret: a
forged cursor either does not read or names a page of a list the caller could have listed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence
from typing import Final

from ..errors import InvalidParams

__all__ = ["URI_SCHEME", "Names", "fingerprint", "mint_cursor", "quoted", "read_cursor"]

URI_SCHEME: Final = "mcp-gateway:"
#: A cursor's bytes: version, page number (4 bytes, big-endian), fingerprint.
_CURSOR_VERSION: Final = 1
_FINGERPRINT_BYTES: Final = 12
_CURSOR_BYTES: Final = 1 + 4 + _FINGERPRINT_BYTES
_MAX_CURSOR_CHARS: Final = 64
#: How much of a caller's or a member's string an error or log message quotes.
_QUOTED_CHARS: Final = 80


class Names:
    """The exposed names of ``members`` (upstream names, in order) joined by ``separator``."""

    def __init__(self, members: Sequence[str], separator: str) -> None:
        self.separator = separator
        # Longest first: with members "a" and "a__b", "a__b__x" is tool "x" of member "a__b".
        self._members = sorted(members, key=len, reverse=True)

    def expose(self, member: str, name: str) -> str:
        """``weather`` + ``get_forecast`` -> ``weather__get_forecast``."""
        return f"{member}{self.separator}{name}"

    def resolve(self, exposed: object) -> tuple[str, str] | None:
        """``(member, name)`` of an exposed tool or prompt name, ``None`` if it names no member."""
        if type(exposed) is not str:
            return None
        for member in self._members:
            prefix = member + self.separator
            if exposed.startswith(prefix) and len(exposed) > len(prefix):
                return member, exposed[len(prefix) :]
        return None

    @staticmethod
    def expose_uri(member: str, uri: str) -> str:
        """``notes`` + ``memo://a`` -> ``mcp-gateway:notes/memo://a`` (templates alike)."""
        return f"{URI_SCHEME}{member}/{uri}"

    def resolve_uri(self, exposed: object) -> tuple[str, str] | None:
        """``(member, uri)`` of an exposed URI, ``None`` if it is not one or names no member."""
        if type(exposed) is not str or not exposed.startswith(URI_SCHEME):
            return None
        member, slash, uri = exposed[len(URI_SCHEME) :].partition("/")
        if not slash or not uri or member not in self._members:
            return None
        return member, uri


def fingerprint(rendered_items: bytes) -> bytes:
    """The fingerprint of a whole aggregate list, from the JSON of its items."""
    return hashlib.blake2b(rendered_items, digest_size=_FINGERPRINT_BYTES).digest()


def mint_cursor(page: int, list_fingerprint: bytes) -> str:
    """The cursor of page ``page`` (0 is the first) of the list of ``list_fingerprint``."""
    return _spelling(bytes((_CURSOR_VERSION,)) + page.to_bytes(4, "big") + list_fingerprint)


def read_cursor(cursor: object, request_id: object) -> tuple[int, bytes]:
    """``(page, fingerprint)`` of a cursor :func:`mint_cursor` made.

    Raises:
        InvalidParams: anything else (-32602: MCP 2026-07-28, server/utilities/pagination,
            'Error Handling').
    """
    if type(cursor) is str and len(cursor) <= _MAX_CURSOR_CHARS:
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) == _CURSOR_BYTES and raw[0] == _CURSOR_VERSION and _spelling(raw) == cursor:
            return int.from_bytes(raw[1:5], "big"), raw[5:]
    raise InvalidParams("Invalid params: cursor is not one this gateway gave", request_id=request_id)


def _spelling(raw: bytes) -> str:
    """The one spelling of a cursor's bytes (unpadded base64url; other spellings are not cursors)."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def quoted(value: object) -> str:
    """``value`` for an error or log message, cut short: a caller's name may be megabytes long."""
    text = repr(value)
    return text if len(text) <= _QUOTED_CHARS else text[: _QUOTED_CHARS - 3] + "..."
