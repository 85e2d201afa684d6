"""A caller's request, rewritten for one member: one value in ``params`` changed, every other
byte of the body as the caller sent it (``_meta`` with ``clientCapabilities``, ``arguments``,
the id, white space), so that the member sees what it would have seen on its own route.

The body has already been parsed and checked (:func:`~gateway.protocol.parse_request`: valid
JSON, no member name repeated), so walking it to find a value's place cannot go astray.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Final

from ..codec import dumps

__all__ = ["replace_value", "with_cursor"]

_DECODER: Final = json.JSONDecoder()
_WHITESPACE: Final = " \t\n\r"

#: name -> (where its name starts, where its value starts, where its value ends), in characters.
Spans = dict[str, tuple[int, int, int]]


def _skip(text: str, at: int) -> int:
    while text[at] in _WHITESPACE:
        at += 1
    return at


def _value_end(text: str, at: int) -> int:
    """Where the JSON value at ``text[at]`` ends. An array or object is walked with a depth
    count, not decoded: the decoder recurses, and would give up on arguments nested deeper than
    the interpreter's stack has room for here, which the member's own route forwards."""
    if text[at] not in "[{":
        return int(_DECODER.raw_decode(text, at)[1])
    depth = 0
    i = at
    while True:
        char = text[i]
        if char == '"':
            i = scanstring(text, i + 1)[1]
            continue
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1


def _members(text: str, at: int) -> Spans:
    """The members of the JSON object whose ``{`` is at ``text[at]``."""
    spans: Spans = {}
    i = _skip(text, at + 1)
    if text[i] == "}":
        return spans
    while True:
        name_start = i
        name, i = scanstring(text, i + 1)
        i = _skip(text, _skip(text, i) + 1)  # past the ':'
        value_start = i
        i = _value_end(text, i)
        spans[name] = (name_start, value_start, i)
        i = _skip(text, i)
        if text[i] != ",":
            return spans
        i = _skip(text, i + 1)


def _object_at(text: str, path: Sequence[str]) -> tuple[Spans, int]:
    """The members of the object at ``path`` (``()``: the body) and where its ``{`` is.

    Raises:
        KeyError: a step of ``path`` is missing or not an object.
    """
    at = _skip(text, 0)
    for step in path:
        _, value_start, _ = _members(text, at)[step]
        if text[value_start] != "{":
            raise KeyError(step)
        at = value_start
    return _members(text, at), at


def replace_value(body: bytes, path: Sequence[str], value: object) -> bytes:
    """``body`` with the value at ``path`` (e.g. ``("params", "name")``) replaced by ``value``'s
    JSON; not one other byte changes.

    Raises:
        KeyError: nothing is at ``path``.
    """
    text = body.decode("utf-8")
    spans, _ = _object_at(text, path[:-1])
    _, start, end = spans[path[-1]]
    return (text[:start] + dumps(value).decode("utf-8") + text[end:]).encode("utf-8")


def with_cursor(body: bytes, cursor: str | None) -> bytes:
    """``body`` (a list request) with ``params.cursor`` set to ``cursor``, or removed for
    ``None``: each other member of ``params`` keeps its bytes (the white space between them is
    not kept). Raises :class:`KeyError` when the body has no ``params`` object."""
    text = body.decode("utf-8")
    spans, at = _object_at(text, ("params",))
    end = at + 1 if not spans else max(value_end for _, _, value_end in spans.values())
    end = _skip(text, end) + 1  # past the params' '}'
    pieces = [text[name_start:value_end] for name, (name_start, _, value_end) in spans.items() if name != "cursor"]
    if cursor is not None:
        pieces.append('"cursor":' + dumps(cursor).decode("utf-8"))
    return (text[:at] + "{" + ",".join(pieces) + "}" + text[end:]).encode("utf-8")
