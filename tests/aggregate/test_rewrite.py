"""Rewriting a caller's body for a member (gateway.aggregate.rewrite): one value changed, every
other byte kept, whatever the nesting of the rest."""

from __future__ import annotations

import json
import sys

from hypothesis import given
from hypothesis import strategies as st

from gateway.aggregate.rewrite import _value_end, replace_value

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@given(json_values, st.sampled_from(["", " ", "\n\t"]))
def test_a_value_ends_where_the_decoder_says_it_does(value: object, space: str) -> None:
    text = json.dumps(value, separators=("," + space, ":" + space)) + space + ',"next":1'
    assert _value_end(text, 0) == json.JSONDecoder().raw_decode(text, 0)[1]


def test_arguments_nested_deeper_than_the_stack_allows_are_kept_byte_for_byte() -> None:
    depth = sys.getrecursionlimit() * 2
    arguments = "[" * depth + '"]}"' + "]" * depth
    body = f'{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"arguments":{arguments},"name":"a__t"}}}}'
    rewritten = replace_value(body.encode(), ("params", "name"), "t")
    assert rewritten == body.replace('"a__t"', '"t"').encode()
