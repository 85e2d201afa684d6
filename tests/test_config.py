"""Config loading (gateway.config) and ``mcp-gateway check-config``."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config, parse_config, read_config
from gateway.config.load import MAX_CONFIG_BYTES

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gw.toml"
    path.write_text(text)
    return path


def test_example_config_is_valid() -> None:
    config = load_config(ROOT / "config" / "example.toml")
    assert set(config.upstreams) == {"weather", "notes"}
    assert config.vary_on_capabilities("weather") is True
    assert config.vary_on_capabilities("notes") is False


def test_defaults_are_the_documented_ones() -> None:
    config = parse_config({"upstreams": {"a": {"url": "http://127.0.0.1:1/mcp"}}})
    assert (config.listener.host, config.listener.port) == ("127.0.0.1", 8080)
    assert (config.cache.max_entries, config.cache.max_entry_bytes, config.cache.max_ttl_ms) == (
        10000,
        4194304,
        3600000,
    )
    up = config.upstreams["a"]
    assert (up.timeout_s, up.connect_timeout_s, up.stream_idle_timeout_s, up.forward_authorization) == (
        30,
        5,
        300,
        False,
    )
    assert config.auth is None and config.admin is None


def test_env_references_are_resolved_at_load_time() -> None:
    config = parse_config(
        {"upstreams": {"a": {"url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer ${TOK}"}}}},
        env={"TOK": "s3cret"},
    )
    assert config.upstreams["a"].headers == {"Authorization": "Bearer s3cret"}


def test_missing_env_variable_is_a_load_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"auth\.tokens\[0\].*GATEWAY_TOKEN"):
        parse_config({"auth": {"tokens": ["${GATEWAY_TOKEN}"]}}, env={})


def test_file_reference_reads_the_secret_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "weather").write_text("s3cret-from-a-file\n")
    path = write(
        tmp_path,
        '[upstreams.a]\nurl = "http://127.0.0.1:1/mcp"\n'
        'headers = { Authorization = "Bearer ${file:secrets/weather}" }\n',
    )
    assert load_config(path, env={}).upstreams["a"].headers == {"Authorization": "Bearer s3cret-from-a-file"}


def test_missing_secret_file_is_a_load_error_naming_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[admin]\ntoken = "${file:/nonexistent/admin-token}"\n')
    with pytest.raises(ConfigError, match=r"admin\.token: cannot read secret file '/nonexistent/admin-token'"):
        load_config(path, env={})


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({"X-Tag": "a\nb"}, "control characters: X-Tag"),
        ({"X-Tag": "a\x00b"}, "control characters: X-Tag"),
        ({"X Tag:": "v"}, "must be tokens"),
    ],
)
def test_a_header_that_could_never_be_sent_is_a_load_error(headers: dict[str, str], problem: str) -> None:
    # Accepted, it was a 500 on every request to the upstream (a bad secret rotation: an outage).
    with pytest.raises(ConfigError, match=rf"upstreams\.a\.headers: header .*{problem}"):
        parse_config({"upstreams": {"a": {"url": "http://127.0.0.1:1/mcp", "headers": headers}}})


def test_a_secret_that_is_a_fifo_is_refused_at_once_never_waited_for(tmp_path: Path) -> None:
    # Opening a FIFO to read waits for a writer: a reload reads on the event loop.
    os.mkfifo(tmp_path / "token.fifo")
    path = write(tmp_path, '[admin]\ntoken = "${file:token.fifo}"\n')
    with pytest.raises(ConfigError, match=r"admin\.token: cannot read secret file .*not a regular file"):
        load_config(path, env={})


def test_a_config_file_over_its_bound_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '[upstreams.a]\nurl = "http://127.0.0.1:1/mcp"\n' + "#" * MAX_CONFIG_BYTES)
    with pytest.raises(ConfigError, match=r"cannot read: larger than"):
        read_config(path, env={})


def test_read_config_gives_the_sha256_of_the_file_bytes(tmp_path: Path) -> None:
    text = '[upstreams.a]\nurl = "http://127.0.0.1:1/mcp"\n'
    loaded = read_config(write(tmp_path, text), env={})
    assert loaded.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert set(loaded.config.upstreams) == {"a"}


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"listener": {"prot": 1}}, "listener.prot"),
        ({"cache": {"max_ttl_ms": 0}}, "cache.max_ttl_ms"),
        ({"upstreams": {"a": {"url": "ftp://x"}}}, "upstreams.a.url"),
        ({"upstreams": {"a": {"url": "http://x/mcp", "timeout": 3}}}, "upstreams.a.timeout"),
        ({"upstreams": {"bad name": {"url": "http://x/mcp"}}}, "upstreams.bad name"),
        ({"upstreams": {"a": {"url": "http://x/mcp", "headers": {"Host": "y"}}}}, "upstreams.a.headers"),
        ({"surprise": 1}, "surprise"),
        ({"auth": {"tokens": ["short"]}}, "auth.tokens[0]"),
    ],
)
def test_invalid_or_unknown_keys_are_named(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, env={})
    assert key in str(info.value)


def test_gateway_auth_and_forward_authorization_cannot_be_combined() -> None:
    with pytest.raises(ConfigError, match="forward_authorization"):
        parse_config(
            {
                "auth": {"tokens": ["x" * 20]},
                "upstreams": {"a": {"url": "http://x/mcp", "forward_authorization": True}},
            },
            env={},
        )


def test_config_is_frozen() -> None:
    config = parse_config({}, env={})
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises its ValidationError
        config.listener.port = 1  # type: ignore[misc]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_check_config_exits_0_for_a_good_file() -> None:
    done = run_cli("check-config", str(ROOT / "config" / "example.toml"))
    assert done.returncode == 0, done.stderr


def test_check_config_exits_2_naming_the_bad_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[upstreams.a]\nurl = "http://127.0.0.1:1/mcp"\ntimeout_s = "soon"\n')
    done = run_cli("check-config", str(path))
    assert done.returncode == 2
    assert "upstreams.a.timeout_s" in done.stderr


def test_check_config_exits_2_on_bad_toml_and_missing_file(tmp_path: Path) -> None:
    assert run_cli("check-config", str(write(tmp_path, "[listener\n"))).returncode == 2
    assert run_cli("check-config", str(tmp_path / "nope.toml")).returncode == 2


# -- what an unknown or bad key's message says ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"cache": {"max_ttl_msec": 1}}, "cache.max_ttl_msec: unknown key (did you mean `max_ttl_ms`?)"),
        ({"listener": {"prot": 1}}, "listener.prot: unknown key (did you mean `port`?)"),
        ({"cahce": {}}, "cahce: unknown key (did you mean `cache`?)"),
        (
            {"upstreams": {"a": {"url": "http://x/mcp", "timeout": 3}}},
            "upstreams.a.timeout: unknown key (did you mean `timeout_s`?)",
        ),
        ({"auth": {"tokens": ["x" * 16], "token": "y"}}, "auth.token: unknown key (did you mean `tokens`?)"),
        ({"surprise": 1}, "surprise: unknown key"),  # nothing close: no guess
    ],
)
def test_an_unknown_key_comes_with_the_closest_valid_key_of_its_table(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, env={})
    assert str(info.value) == message


def test_a_file_names_the_line_of_each_bad_key_in_line_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "# a gateway\n"
        "cache.max_ttl_msec = 1\n"  # a dotted key at the top level
        "[listener]\n"
        "port = 8080\n"
        '[upstreams."a"]\n'
        'url = "http://127.0.0.1:1/mcp"\n'
        "timeout = 3   # seconds\n"
        "[upstreams.b]\n"  # no url
        "[registry]\n"
        "probe_timeout_s = 0\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: line 2: cache.max_ttl_msec: unknown key (did you mean `max_ttl_ms`?); "
        "line 7: upstreams.a.timeout: unknown key (did you mean `timeout_s`?); "
        "line 8: upstreams.b.url: Field required; "
        "line 10: registry.probe_timeout_s: Input should be greater than 0"
    )


def test_a_line_is_given_only_where_it_is_certain(tmp_path: Path) -> None:
    """Inside an inline table the key's line is not looked for; text in a multi-line string that
    looks like a key is not taken for one."""
    path = write(
        tmp_path,
        "listener = { prot = 1 }\n"
        "[upstreams.a]\n"
        'url = "http://127.0.0.1:1/mcp"\n'
        "[admin]\n"
        'token = """\n'
        "[cache]\n"
        "max_ttl_msec = 2\n"
        '"""\n'
        "[cache]\n"
        "max_ttl_msec = 1\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: line 10: cache.max_ttl_msec: unknown key (did you mean `max_ttl_ms`?); "
        "listener.prot: unknown key (did you mean `port`?)"
    )


def test_check_config_prints_one_line_with_the_key_meant_and_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[cache]\nmax_ttl_msec = 1\n[upstreams.a]\nurl = "http://127.0.0.1:1/mcp"\n')
    done = run_cli("check-config", str(path))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"mcp-gateway: invalid config: {path}: line 2: cache.max_ttl_msec: unknown key (did you mean `max_ttl_ms`?)\n"
    )


def test_registry_table_is_optional_validated_and_strict() -> None:
    assert parse_config({}).registry.enabled is True  # on by default
    assert parse_config({"registry": {"enabled": False}}).registry.enabled is False
    cfg = parse_config({"registry": {}}).registry
    assert (cfg.probe_min_interval_s, cfg.probe_max_interval_s, cfg.probe_timeout_s) == (10, 300, 10)
    assert (cfg.backoff_base_s, cfg.backoff_max_s, cfg.listen) == (1, 120, True)
    for bad, where in [
        ({"probe_min_interval_s": 5, "probe_max_interval_s": 1}, "registry"),
        ({"backoff_base_s": 9, "backoff_max_s": 1}, "registry"),
        ({"probe_timeout_s": 0}, "registry.probe_timeout_s"),
        ({"server_namespace": "has/slash"}, "registry.server_namespace"),
        ({"probe_every": 1}, "registry.probe_every: unknown key"),
    ]:
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            parse_config({"registry": bad})
