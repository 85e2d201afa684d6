"""What ``check-config`` says about the keys of ``[auth]``'s and ``[policy]``'s tables and arrays of
tables (gateway/config/load.py): the entry's own keys, the line, and what to write instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config

UPSTREAM = '[upstreams.weather]\nurl = "http://127.0.0.1:9/mcp"\n'
TOKEN = "t" * 16


def problems(tmp_path: Path, text: str) -> str:
    """The message of the load error of the config file ``text``, without its path."""
    path = tmp_path / "gw.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    return str(info.value).removeprefix(f"{path}: ")


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("tool", "tools"),
        ("scope", "scopes"),
        ("upstream", "upstreams"),
        ("prompt", "prompts"),
        ("resource", "resources"),
        ("claim", "claims"),
        ("nmae", "name"),
    ],
)
def test_a_misspelt_key_of_a_rule_suggests_the_rules_own_key_at_its_line(tmp_path: Path, typo: str, meant: str) -> None:
    text = f'{UPSTREAM}[[policy.rules]]\nname = "first"\n\n[[policy.rules]]\nname = "second"\n{typo} = ["x"]\n'
    message = problems(tmp_path, text)
    if typo == "nmae":  # the second rule has no name: the missing key at its header's line
        message = message.removeprefix("line 6: policy.rules[1].name: Field required; ")
    assert message == f"line 8: policy.rules[1].{typo}: unknown key (did you mean `{meant}`?)"


def test_a_misspelt_key_of_a_static_token_suggests_subject_at_its_line(tmp_path: Path) -> None:
    text = f'[[auth.static]]\ntoken = "{TOKEN}"\nsubjct = "ci"\n{UPSTREAM}'
    assert problems(tmp_path, text) == (
        "line 1: auth.static[0].subject: Field required; "
        "line 3: auth.static[0].subjct: unknown key (did you mean `subject`?)"
    )


def test_a_string_where_a_list_is_expected_says_to_write_a_list(tmp_path: Path) -> None:
    text = (
        f'{UPSTREAM}[[auth.static]]\ntoken = "{TOKEN}"\nsubject = "ci"\nscopes = "mcp:read"\n'
        '[auth.jwt]\nissuer = "https://idp.example.com"\njwks_url = "https://idp.example.com/certs"\n'
        'algorithms = "RS256"\n'
        '[[policy.rules]]\nname = "read"\ntools = "get_*"\n'
    )
    assert problems(tmp_path, text) == (
        'line 6: auth.static[0].scopes: must be a list (e.g. `["mcp:read"]`); '
        'line 10: auth.jwt.algorithms: must be a list (e.g. `["RS256"]`); '
        'line 13: policy.rules[0].tools: must be a list (e.g. `["get_*"]`)'
    )


def test_one_table_where_an_array_of_tables_is_expected_says_to_write_double_brackets(tmp_path: Path) -> None:
    text = f'{UPSTREAM}[auth.static]\ntoken = "{TOKEN}"\nsubject = "ci"\n[policy.rules]\nname = "read"\n'
    assert problems(tmp_path, text) == (
        "line 3: auth.static: must be an array of tables: write `[[auth.static]]` (double brackets) for each "
        "entry, not `[auth.static]`; "
        "line 6: policy.rules: must be an array of tables: write `[[policy.rules]]` (double brackets) for each "
        "entry, not `[policy.rules]`"
    )


def test_an_array_of_tables_where_one_table_is_expected_says_to_write_single_brackets(tmp_path: Path) -> None:
    text = f'{UPSTREAM}[[auth.jwt]]\nissuer = "https://idp.example.com"\n'
    assert (
        problems(tmp_path, text)
        == "line 3: auth.jwt: must be a table: write `[auth.jwt]` (one table), not `[[auth.jwt]]`"
    )


def test_a_key_of_the_table_next_door_names_the_table_it_belongs_in(tmp_path: Path) -> None:
    text = (
        f'{UPSTREAM}[auth.jwt]\nissuer = "https://idp.example.com"\njwks_url = "https://idp.example.com/certs"\n'
        'algorithms = ["RS256"]\npublic_base_url = "https://gw.example.com"\n'
    )
    assert problems(tmp_path, text) == (
        "line 7: auth.jwt.public_base_url: unknown key (`public_base_url` belongs in `[auth.resource]`)"
    )


def test_an_element_of_an_array_is_named_in_brackets_at_its_keys_line(tmp_path: Path) -> None:
    """As ``${NAME}`` references are named (``auth.tokens[0]``), and the troubleshooting page shows."""
    text = f'{UPSTREAM}[auth]\ntokens = ["{TOKEN}", "short"]\n'
    assert problems(tmp_path, text) == "line 4: auth.tokens[1]: String should have at least 16 characters"
    text = f'{UPSTREAM}[auth]\ntokens = ["{TOKEN}", "${{GATEWAY_TOKEN}}"]\n'
    assert problems(tmp_path, text) == "auth.tokens[1]: environment variable GATEWAY_TOKEN is not set"
