"""JSON in and out, exactly (RFC 8259): orjson where it is exact, the standard library where not.

orjson rounds integers beyond 64 bits to floats and refuses lone surrogate escapes, both of which
JSON allows; :func:`loads` and :func:`dumps` send such documents to the standard library, so a
cache key or a stored result never differs from what the caller or the upstream wrote.
:func:`loads_relayed` checks an answer that is relayed, not stored, for its envelope only.
"""

from __future__ import annotations

import json
from typing import Any, Final

import orjson

try:  # the ``speed`` extra: relayed answers are checked without building their result
    import simdjson
except ImportError:  # pragma: no cover - exercised by forcing _ENVELOPE_PARSER to None
    simdjson = None  # type: ignore[assignment]

__all__ = [
    "ENVELOPE_MAX_BYTES",
    "ENVELOPE_MIN_BYTES",
    "Unrepresentable",
    "dumps",
    "duplicate_members",
    "id_json",
    "loads",
    "loads_relayed",
]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: orjson turns integers outside [-2**63, 2**64) into floats, silently: any run of 19+
#: digits sends the text to the standard library, which keeps integers exact. The run is
#: found by mapping every digit to ``0`` and everything else to a space, then a substring
#: search: both in C, ~15x faster than a regular expression (~30 µs, not ~430 µs, on a
#: 19 KB ``tools/list``).
_DIGITS_TO_ZERO: Final = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_DIGITS: Final = b"0" * 19


def loads(data: bytes) -> Any:
    """Parse JSON (RFC 8259) exactly: orjson, or the standard library for what orjson
    refuses or rounds but JSON allows (integers beyond 64 bits, lone surrogate escapes).

    Raises:
        ValueError: not JSON (``NaN``/``Infinity`` literals included), not UTF-8, or nested
            too deeply.
    """
    # find(), not "in": bytes.__contains__ first tries the needle as an integer and raises
    # (and clears) a TypeError on every call.
    if data.translate(_DIGITS_TO_ZERO).find(_LONG_DIGITS) < 0:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    try:
        # Strict UTF-8 first: json.loads(bytes) would guess UTF-16/32 (RFC 8259 §8.1: UTF-8).
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant, parse_float=_parse_float)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


def duplicate_members(data: bytes, value: Any) -> tuple[str, ...]:
    """The member names that some object in the JSON text ``data`` holds more than once, in the
    order the objects close; ``()`` when none. ``value`` is ``data`` as :func:`loads` parsed it.

    Why: JSON parsers disagree on which value a repeated name keeps (RFC 8259 §4: names SHOULD
    be unique). The gateway reads the last; an upstream that reads the first would answer
    another request than the one the gateway keyed, and that answer would be cached.
    """
    # ✂ fast path, for the usual compact body: text that is written back byte for byte from
    # its parsed value has no repeated name (a repeat would be missing from the value's text).
    try:
        if dumps(value) == data:
            return ()
    except ValueError:
        pass
    # ✂
    found: list[str] = []

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            for name, _ in pairs:
                if name in seen:
                    found.append(name)
                seen.add(name)
        return obj

    try:
        json.loads(
            data.decode("utf-8"), object_pairs_hook=unique, parse_constant=_reject_constant, parse_float=_parse_float
        )
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc
    return tuple(found)


def loads_relayed(data: bytes, request_id: object) -> Any:
    """Parse an upstream answer that is relayed, not stored, for its envelope: ``jsonrpc``,
    ``id`` and ``error.code`` (the bytes relayed are the upstream's own).

    A success of ``ENVELOPE_MIN_BYTES`` to ``ENVELOPE_MAX_BYTES``, with simdjson installed (the
    ``speed`` extra), comes back as ``{"jsonrpc", "id", "result": True}`` (the members present): the
    whole document is validated, the result is not built (~15 µs instead of ~110 µs for a
    19 KB ``tools/list``). Anything else (errors, duplicate or odd top-level members, what
    simdjson refuses) is parsed by orjson, without :func:`loads`'s scan for long integers:
    an integer beyond 64 bits comes back as a float, which changes nothing here unless the
    request's id is such an integer (then :func:`loads`). A float error code is not logged
    as a code.

    Raises:
        ValueError: not JSON.
    """
    if type(request_id) is int and not _INT64_MIN <= request_id <= _UINT64_MAX:
        return loads(data)
    if _ENVELOPE_PARSER is not None and ENVELOPE_MIN_BYTES <= len(data) <= ENVELOPE_MAX_BYTES:
        envelope = _envelope(_ENVELOPE_PARSER, data)
        if envelope is not None:
            return envelope
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return loads(data)  # what orjson refuses but JSON allows (lone surrogate escapes)


#: Relayed answers of these sizes are checked with simdjson, when installed. The parser keeps
#: buffers for the largest document it parsed (1.8 MB after a 256 KB one): bounded.
ENVELOPE_MIN_BYTES: Final = 2048
ENVELOPE_MAX_BYTES: Final = 256 * 1024
_ENVELOPE_PARSER: Any = simdjson.Parser(max_capacity=ENVELOPE_MAX_BYTES) if simdjson is not None else None
_ENVELOPE_SCALARS: Final = (str, int, float, bool, type(None))


def _envelope(parser: Any, data: bytes) -> dict[str, Any] | None:
    """The envelope of a JSON-RPC success in ``data``, or ``None`` to let orjson decide."""
    try:
        doc = parser.parse(data)
    except (ValueError, RuntimeError):  # not JSON to simdjson, or a number beyond 64 bits
        return None
    try:
        if not isinstance(doc, simdjson.Object) or "error" in doc or "result" not in doc:
            return None
        keys = list(doc.keys())
        if len(keys) != len(set(keys)):
            return None  # duplicate members: orjson keeps the last, simdjson the first
        envelope: dict[str, Any] = {"result": True}
        for name in ("jsonrpc", "id"):
            if name in doc:
                value = doc[name]
                if type(value) not in _ENVELOPE_SCALARS:
                    return None  # an object or array (no JSON-RPC answer has one there)
                envelope[name] = value
        return envelope
    finally:
        # The parser is reused: nothing may keep a reference into this document.
        del doc


_INT64_MIN: Final = -(2**63)
_UINT64_MAX: Final = 2**64 - 1


class Unrepresentable(float):
    """A JSON number beyond the float range (``1e400``): kept apart from ``null`` (orjson
    would write ``inf`` as ``null``), refused by :func:`dumps`, so never part of a cache
    key or a stored result."""


def _parse_float(text: str) -> float:
    value = float(text)
    return value if value not in (_INF, -_INF) else Unrepresentable(value)


_INF: Final = float("inf")


def dumps(value: object, *, sort_keys: bool = False) -> bytes:
    """Serialise to compact JSON with orjson; values orjson cannot write (integers beyond
    64 bits, lone surrogates, :class:`Unrepresentable`) go through the standard library,
    ASCII-escaped.

    Raises:
        ValueError: ``value`` holds an :class:`Unrepresentable` number (or any non-finite float,
            when the standard library writes it: orjson writes a plain ``nan``/``inf`` as
            ``null``), or is nested too deeply.
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except TypeError:  # orjson.JSONEncodeError: big integers, lone surrogates, Unrepresentable
        try:
            return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"), allow_nan=False).encode()
        except RecursionError as exc:
            raise ValueError("JSON nested too deeply") from exc


def id_json(request_id: object) -> bytes:
    """The JSON of a JSON-RPC id (a string or an integer; :func:`dumps` for big integers)."""
    try:
        return orjson.dumps(request_id)
    except TypeError:
        return dumps(request_id)
