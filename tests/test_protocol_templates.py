"""parse_request (remembered parses of requests that differ only in their id) answers exactly as
plain_parse_request: the same result or the same error, whatever was parsed before."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from gateway.errors import GatewayError
from gateway.protocol import parse_request, plain_parse_request

from .support import V, request_meta


def outcome(parse: Any, body: bytes, headers: CIMultiDict[str]) -> tuple[object, ...]:
    """What a parse gave, comparable: the fields of the result, or the error's class, text,
    id and code."""
    try:
        p = parse(body, headers)
    except GatewayError as err:
        return ("error", type(err), str(err), err.request_id, type(err.request_id), err.code)
    return ("parsed", p.kind, p.request_id, type(p.request_id), p.method, p.era, p.version, p.params, p.cache_bypass)


def text(members: list[str], id_text: str | None, at: int) -> bytes:
    """A JSON object's text of ``members`` (member texts), with ``"id":<id_text>`` at ``at``."""
    if id_text is not None:
        members = [*members[:at], f'"id":{id_text}', *members[at:]]
    return ("{" + ",".join(members) + "}").encode()


def headers_of(version: list[str], method: list[str], name: list[str], session: bool) -> CIMultiDict[str]:
    h: CIMultiDict[str] = CIMultiDict()
    for value in version:
        h.add("MCP-Protocol-Version", value)
    for value in method:
        h.add("Mcp-Method", value)
    for value in name:
        h.add("Mcp-Name", value)
    if session:
        h.add("Mcp-Session-Id", "s-1")
    return h


_methods = st.sampled_from(["tools/list", "server/discover", "resources/read", "tools/call", "initialize"])
_id_texts = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.sampled_from(["0", "01", "-0", "007", "1.0", "1e3", '"7"', '"a,b"', "true", "null", " 5", "5 "]),
)
_extras = st.lists(
    st.sampled_from(
        [
            '"x":1',
            '"x\\"id":5',  # a key ending in "id": the text '"id":5}' without being the id
            '"y":{"id":5}',
            '"id":5',  # the id twice
            '"jsonrpc":"2.0"',
        ]
    ),
    max_size=2,
)


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    method = draw(_methods)
    params: dict[str, Any] = {"_meta": request_meta(draw(st.sampled_from([V, "2025-11-25"])))}
    if draw(st.booleans()):
        params["cursor"] = draw(st.sampled_from(["c", 'q"id":1', "id"]))
    if method in ("resources/read", "tools/call"):
        params["uri" if method == "resources/read" else "name"] = "file:///a"
    members = ['"jsonrpc":"2.0"', f'"method":{json.dumps(method)}', f'"params":{json.dumps(params)}']
    members += draw(_extras)
    at = draw(st.sampled_from([1, len(members), 0, 2]))
    header = {
        "version": draw(st.sampled_from([[V], [V, V], [V, "2025-11-25"], [], ["2025-11-25"]])),
        "method": draw(st.sampled_from([[method], [method, method], [method, "tools/call"], [], ["tools/list"]])),
        "name": draw(st.sampled_from([[], ["file:///a"], ["file:///b"], ["file:///a", "file:///b"]])),
        "session": draw(st.booleans()),
    }
    primer_header = draw(
        st.sampled_from(
            [header, {**header, "method": [method]}, {**header, "version": [V]}, {**header, "session": False}]
        )
    )
    return {
        "members": members,
        "at": at,
        "id": draw(_id_texts),
        "primer_id": draw(st.sampled_from(["1", "42", "0", "123456789012345678"])),
        "headers": headers_of(**header),
        "primer_headers": headers_of(**primer_header),
    }


def case_of(
    id_text: str, at: int, primer_id: str = "1", last: str | None = None, uri: str | None = None, **headers: Any
) -> dict[str, Any]:
    """A ``tools/list`` case (with ``uri``, ``resources/read``; see :func:`cases`): ``last`` a
    member after ``params``; ``headers`` those of the request asked (the primer's are right)."""
    method = "tools/list" if uri is None else "resources/read"
    params = {"_meta": request_meta()} | ({} if uri is None else {"uri": uri})
    members = ['"jsonrpc":"2.0"', f'"method":"{method}"', f'"params":{json.dumps(params)}']
    members += [last] if last is not None else []
    right = {"version": [V], "method": [method], "name": [] if uri is None else [uri], "session": False}
    return {
        "members": members,
        "at": at,
        "id": id_text,
        "primer_id": primer_id,
        "headers": headers_of(**(right | headers)),
        "primer_headers": headers_of(**right),
    }


@settings(max_examples=500, deadline=None)
@given(case=cases())
@example(case=case_of("01", 1))  # not JSON
@example(case=case_of("01", 3))
@example(case=case_of("-1", 3))
@example(case=case_of("6", 0, "5", last='"x\\"id":5'))  # a key ending in "id" last, the id first
@example(case=case_of("2", 1, session=True))  # legacy
@example(case=case_of("2", 3, version=[V, "2025-11-25"]))
@example(case=case_of("2", 3, method=["tools/list", "tools/list"]))
@example(case=case_of("2", 3, uri="file:///a", name=["file:///b"]))
def test_a_remembered_parse_answers_as_the_plain_parse(case: dict[str, Any]) -> None:
    members, at = case["members"], case["at"]
    # Parsed before: the same text with another id, maybe with other headers.
    outcome(parse_request, text(members, case["primer_id"], at), case["primer_headers"])
    body = text(members, case["id"], at)
    assert outcome(parse_request, body, case["headers"]) == outcome(plain_parse_request, body, case["headers"])
    # The text whose id was swapped for another, where the primer's id sat (a key ending in "id").
    swapped = text([m.replace(":5", f":{case['id']}") for m in members], case["primer_id"], at)
    assert outcome(parse_request, swapped, case["headers"]) == outcome(plain_parse_request, swapped, case["headers"])


def test_a_request_that_differs_from_one_parsed_before_only_in_its_id_reuses_its_parse() -> None:
    """The speed-up is in effect, for both places SDK clients write the id."""
    params = json.dumps({"_meta": request_meta()})
    headers = headers_of([V], ["tools/list"], [], False)
    for at in (1, 3):  # just after "jsonrpc" at the start, and last
        members = ['"jsonrpc":"2.0"', '"method":"tools/list"', f'"params":{params}']
        first = parse_request(text(members, "1", at), headers)
        second = parse_request(text(members, "2", at), headers)
        assert (first.request_id, second.request_id) == (1, 2)
        assert second.params is first.params
        third = text(members, "3", at)
        assert outcome(parse_request, third, headers) == outcome(plain_parse_request, third, headers)
