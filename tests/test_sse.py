"""The event-stream parser (gateway.sse): events whatever the chunking and line endings, and a
bounded buffer."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.sse import SSEParser


@given(
    st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n")), min_size=1),
    st.sampled_from([b"\n", b"\r\n", b"\r"]),
    st.integers(min_value=1, max_value=7),
)
def test_sse_parser_reassembles_events_split_anywhere(lines: list[str], eol: bytes, step: int) -> None:
    data = [line.encode() for line in lines]
    stream = b": keep-alive" + eol + b"event: message" + eol
    stream += b"".join(b"data: " + d + eol for d in data) + eol
    parser = SSEParser(1 << 20)
    events = []
    for i in range(0, len(stream), step):
        events += parser.feed(stream[i : i + step])
    events += parser.feed(b"")
    if eol == b"\r":
        events += parser.feed(b"\n")  # a trailing CR is only final once the next byte is seen
    assert events == [b"\n".join(data)]


def test_sse_parser_marks_overflow() -> None:
    parser = SSEParser(10)
    assert parser.feed(b"data: " + b"x" * 50) == []
    assert parser.overflowed
