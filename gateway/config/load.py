"""Loading the config: TOML, ``${NAME}`` from the environment, ``${file:PATH}`` from a file, and
error messages that name the key at fault (with the closest valid key, and the line where it is
certain).

Unknown keys are errors; ``${NAME}`` inside any string value is replaced by the environment
variable ``NAME`` at load time, and a missing variable is a load error; ``${file:PATH}`` by the
contents of the file ``PATH`` (a secret mounted as a file; relative to the config file's
directory; one trailing newline dropped), and a file that cannot be read is a load error. Both
are read again at each load (a reload included).
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import json
import os
import re
import stat
import sys
import tomllib
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from .base import AT
from .model import GatewayConfig

__all__ = ["ConfigError", "LoadedConfig", "load_config", "parse_config", "read_config", "secret_files"]

#: ``${NAME}`` (group 1) or ``${file:PATH}`` (group 2).
_REF = re.compile(r"\$\{(?:([A-Za-z_][A-Za-z0-9_]*)|file:([^}]+))\}")


class ConfigError(Exception):
    """The config file cannot be used; the message names the key at fault."""


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A config file read and validated: ``config``, and ``sha256``, the hex SHA-256 of the
    file's bytes as read (what ``mcp_gateway_config_info`` and ``/readyz`` show)."""

    config: GatewayConfig
    sha256: str


#: The largest config file and secret file read, in bytes: a reload reads them on the event loop,
#: which a huge file would hold.
MAX_CONFIG_BYTES: Final = 4 * 1024 * 1024
MAX_SECRET_BYTES: Final = 64 * 1024


def read_regular(file: Path, limit: int) -> bytes:
    """The bytes of ``file``, a regular file of at most ``limit`` bytes: never a FIFO or a device,
    whose read could wait forever (the reload reads on the event loop).

    Raises:
        OSError: it cannot be read, is not a regular file, or is larger (``strerror`` says which).
    """
    info = file.stat()  # before opening: opening a FIFO to read waits for a writer
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EINVAL, "not a regular file")
    if info.st_size > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    with file.open("rb") as handle:
        data = handle.read(limit + 1)  # it may have grown since the stat
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return data


def _read_secret(spec: str, path: str, base: Path) -> str:
    """The contents of the file ``spec`` (relative to ``base``), one trailing newline dropped.

    Raises:
        ConfigError: the file cannot be read, is not a regular file of at most
            :data:`MAX_SECRET_BYTES`, or is not UTF-8, naming the key ``path``.
    """
    file = base / spec.strip()
    try:
        text = read_regular(file, MAX_SECRET_BYTES).decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read secret file {str(file)!r}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: secret file {str(file)!r} is not UTF-8") from exc
    # What `echo secret > file` and most secret mounts write: the newline is no part of the secret.
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def _substitute(value: Any, path: str, env: Mapping[str, str], base: Path) -> Any:
    if isinstance(value, str):

        def repl(m: re.Match[str]) -> str:
            name, secret_file = m.group(1), m.group(2)
            if secret_file is not None:
                return _read_secret(secret_file, path, base)
            if name not in env:
                raise ConfigError(f"{path}: environment variable {name} is not set")
            return env[name]

        return _REF.sub(repl, value)
    if isinstance(value, dict):
        return {k: _substitute(v, f"{path}.{k}" if path else k, env, base) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, f"{path}[{i}]", env, base) for i, v in enumerate(value)]
    return value


def _unwrap(node: Any) -> Any:
    """``X`` of ``Annotated[X, ...]`` and of ``X | None``."""
    while True:
        origin = get_origin(node)
        if origin is Annotated:
            node = get_args(node)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(node) if a is not type(None)]
            if len(args) != 1:
                return node
            node = args[0]
        else:
            return node


#: A key's place in the config: table and key names, and the index of an array's element
#: (``("policy", "rules", 0, "tools")``, written ``policy.rules[0].tools``).
Loc = tuple[str | int, ...]


def _node_at(loc: Loc) -> Any:
    """The type of the value at ``loc`` in the model (a model class, ``tuple[X, ...]``, a
    ``Mapping``...), or None when ``loc`` is not in the model."""
    node: Any = GatewayConfig
    for part in loc:
        node = _unwrap(node)
        if isinstance(part, int):
            if get_origin(node) is not tuple:
                return None
            node = get_args(node)[0]
        elif isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(part)
            if field is None:
                return None
            node = field.annotation
        elif get_origin(node) is Mapping:
            node = get_args(node)[1]
        else:
            return None
    return _unwrap(node)


def _is_model(node: Any) -> bool:
    return isinstance(node, type) and issubclass(node, BaseModel)


def _keys_of_table(table: Loc) -> tuple[str, ...]:
    """The keys allowed in the table at ``table`` (``("cache",)``, ``("upstreams", "a")``,
    ``("policy", "rules", 0)``, ``()`` for the top level), or none when it is not a table of the model."""
    node = _node_at(table)
    return tuple(node.model_fields) if _is_model(node) else ()


def _dotted(loc: Loc) -> str:
    """``("policy", "rules", 0, "tools")`` -> ``policy.rules[0].tools``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return out


def _header(table: tuple[str, ...]) -> str:
    """How the table at ``table`` is written: ``[auth.jwt]``, ``[[auth.static]]``, ``[upstreams.NAME]``."""
    node = _node_at(table)
    if get_origin(node) is tuple:
        return f"[[{_dotted(table)}]]"
    return f"[{_dotted(table)}.NAME]" if get_origin(node) is Mapping else f"[{_dotted(table)}]"


def _elsewhere(key: str, table: Loc) -> str | None:
    """The header of a table next to ``table`` (in the same parent) that has ``key``, if one does."""
    own = table
    while own and isinstance(own[-1], int):
        own = own[:-1]
    parent = own[:-1]
    model = _node_at(parent)
    if not own or not _is_model(model) or not all(isinstance(part, str) for part in parent):
        return None
    for name, field in model.model_fields.items():
        node = _unwrap(field.annotation)
        origin = get_origin(node)
        entry = get_args(node)[0 if origin is tuple else -1] if origin in (tuple, Mapping) else node
        if name != own[-1] and _is_model(entry) and key in entry.model_fields:
            return _header((*parent, name))  # type: ignore[arg-type]  # all str: checked above
    return None


def _unknown_key(loc: Loc) -> str:
    """``unknown key``, with the closest key allowed in its table when one is close enough, else
    the table next to it where the key belongs."""
    key = str(loc[-1])
    close = difflib.get_close_matches(key, _keys_of_table(loc[:-1]), n=1)
    if close:
        return f"unknown key (did you mean `{close[0]}`?)"
    there = _elsewhere(key, loc[:-1])
    return f"unknown key (`{key}` belongs in `{there}`)" if there else "unknown key"


def _wrong_shape(kind: str, loc: Loc, value: Any) -> str | None:
    """What to write instead, for a value that is not the list (``kind`` ``tuple_type``) or the
    table (``model_type``) the key needs; None when pydantic's own words are clear enough."""
    node = _node_at(loc)
    named = all(isinstance(part, str) for part in loc)
    if kind == "tuple_type" and get_origin(node) is tuple:
        if _is_model(get_args(node)[0]) and named and loc:
            # [auth.static] is one table; an array of tables is written [[auth.static]], once per entry.
            one = f", not `[{_dotted(loc)}]`" if isinstance(value, dict) else ""
            return f"must be an array of tables: write `[[{_dotted(loc)}]]` (double brackets) for each entry{one}"
        example = json.dumps([value], ensure_ascii=False) if isinstance(value, str | int | float) else '["..."]'
        return f"must be a list (e.g. `{example}`)"
    if kind == "model_type" and _is_model(node) and named and loc:
        twice = " (one table), not `[[" + _dotted(loc) + "]]`" if isinstance(value, list) else ""
        return f"must be a table: write `[{_dotted(loc)}]`{twice}"
    return None


# Just enough of TOML's key syntax to find the line of a key in a file that tomllib parsed.
_KEY_PART = re.compile(r"""[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*'""")
_DOTTED = rf"(?:{_KEY_PART.pattern})(?:[ \t]*\.[ \t]*(?:{_KEY_PART.pattern}))*"
_TABLE_LINE = re.compile(rf"[ \t]*\[[ \t]*({_DOTTED})[ \t]*\][ \t]*(?:#.*)?")
_ARRAY_TABLE_LINE = re.compile(rf"[ \t]*\[\[[ \t]*({_DOTTED})[ \t]*\]\][ \t]*(?:#.*)?")
_KEY_LINE = re.compile(rf"[ \t]*({_DOTTED})[ \t]*=")


def _split_key(dotted: str) -> tuple[str, ...] | None:
    """``a."b.c".'d'`` -> ``("a", "b.c", "d")``; None for a quoted key with escapes JSON lacks."""
    parts = []
    for match in _KEY_PART.finditer(dotted):
        part = match.group(0)
        if part.startswith('"'):
            try:
                part = json.loads(part)
            except ValueError:
                return None
        elif part.startswith("'"):
            part = part[1:-1]
        parts.append(part)
    return tuple(parts)


def _resolve(header: tuple[str, ...], arrays: dict[Loc, int], new_entry: bool) -> Loc:
    """The full path of the table a header opens: each array of tables on the way stands for its
    last entry so far (TOML 1.0, 'Array of Tables'); with ``new_entry`` (a ``[[...]]`` header) the
    header's own array gains one, counted in ``arrays`` (path of the array -> its entries)."""
    path: Loc = ()
    for i, part in enumerate(header):
        path = (*path, part)
        if new_entry and i == len(header) - 1:
            arrays[path] = arrays.get(path, 0) + 1
            path = (*path, arrays[path] - 1)
        elif path in arrays:
            path = (*path, arrays[path] - 1)
    return path


def _key_lines(text: str) -> dict[Loc, list[int]]:
    """The lines (1-based) where each table header and key of a valid TOML ``text`` appears,
    by full path (``[upstreams.a]`` then ``timeout = 3``: ``("upstreams", "a", "timeout")``;
    the second ``[[policy.rules]]`` then ``tools = []``: ``("policy", "rules", 1, "tools")``).
    Keys inside inline tables are not found; lines inside multi-line strings are skipped."""
    found: dict[Loc, list[int]] = {}
    arrays: dict[Loc, int] = {}
    table: Loc | None = ()
    in_string = False
    for number, line in enumerate(text.splitlines(), 1):
        quotes = line.count('"""') + line.count("'''")
        if in_string:
            in_string = quotes % 2 == 0
            continue
        in_string = quotes % 2 == 1
        header = _ARRAY_TABLE_LINE.fullmatch(line) or _TABLE_LINE.fullmatch(line)
        if header:
            parts = _split_key(header.group(1))
            table = None if parts is None else _resolve(parts, arrays, header.re is _ARRAY_TABLE_LINE)
            if table is not None:
                found.setdefault(table, []).append(number)
        elif line.lstrip().startswith("["):
            table = None  # a header this reader cannot follow: no line is certain until the next one
        elif table is not None and (key := _KEY_LINE.match(line)):
            path = _split_key(key.group(1))
            if path is not None:
                found.setdefault((*table, *path), []).append(number)
    return found


def _problems(exc: ValidationError, source: str | None) -> str:
    """One ``[line N: ]KEY: what is wrong`` per error of ``exc``, joined with ``; `` in the order
    of their lines (those without one last); the line only when ``source`` (the file's text) has
    exactly one line for the key (or the array it is an element of; for a missing key, its
    table). KEY is written ``policy.rules[0].tools``."""
    lines = _key_lines(source) if source is not None else {}
    out: list[tuple[int, str]] = []
    for err in exc.errors():
        # A validator that checks a whole table names the key at fault below it (base.located_error).
        full: Loc = (*err["loc"], *err.get("ctx", {}).get(AT, ()))
        path: Loc = ()
        for part in full:
            if part == "[key]":
                break
            path = (*path, part)
        loc = _dotted(full) or "(top level)"
        if err["type"] == "extra_forbidden":
            msg = _unknown_key(path)
        else:
            # pydantic prefixes a validator's own message with "Value error, ": the message is ours alone.
            msg = _wrong_shape(err["type"], path, err["input"]) or err["msg"].removeprefix("Value error, ")
        value_of = path
        while value_of and isinstance(value_of[-1], int):
            value_of = value_of[:-1]  # an element of an array written on its key's line
        at = (
            lines.get(path)
            or lines.get(value_of)
            or (lines.get(path[:-1]) if err["type"] == "missing" and path else None)
            # [[auth.jwt]] written once for [auth.jwt]: the line of that one entry.
            or (lines.get((*path, 0)) if err["type"] == "model_type" and (*path, 1) not in lines else None)
        )
        if at and len(at) == 1:
            out.append((at[0], f"line {at[0]}: {loc}: {msg}"))
        else:
            out.append((sys.maxsize, f"{loc}: {msg}"))
    return "; ".join(text for _, text in sorted(out, key=lambda item: item[0]))


def parse_config(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Validate already-parsed TOML data, replacing ``${NAME}`` from ``env`` (default ``os.environ``)
    and ``${file:PATH}`` from files (relative to the working directory).

    Raises:
        ConfigError: a missing environment variable or an invalid/unknown key, naming it (an
            unknown key with the closest valid one: ``unknown key (did you mean `max_ttl_ms`?)``).
    """
    return _validate(data, env, None, Path.cwd())


def _validate(data: Mapping[str, Any], env: Mapping[str, str] | None, source: str | None, base: Path) -> GatewayConfig:
    resolved = _substitute(dict(data), "", os.environ if env is None else env, base)
    try:
        return GatewayConfig.model_validate(resolved)
    except ValidationError as exc:
        raise ConfigError(_problems(exc, source)) from exc


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read and validate the TOML file at ``path`` (:func:`read_config`, without the digest).

    Raises:
        ConfigError: as :func:`read_config`.
    """
    return read_config(path, env).config


def read_config(path: str | Path, env: Mapping[str, str] | None = None) -> LoadedConfig:
    """Read and validate the TOML file at ``path``: what ``check-config``, ``serve`` and a reload
    all do.

    Raises:
        ConfigError: unreadable file, invalid TOML, missing variable or secret file, invalid or
            unknown key; the message starts with ``path`` and gives the line where it can be sure
            of it (``gw.toml: line 3: cache.max_ttl_msec: unknown key (did you mean `max_ttl_ms`?)``).
    """
    try:
        raw = read_regular(Path(path), MAX_CONFIG_BYTES)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    try:
        config = _validate(data, env, text, Path(path).parent)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc.__cause__
    return LoadedConfig(config, hashlib.sha256(raw).hexdigest())


def secret_files(path: str | Path) -> tuple[Path, ...]:
    """The files the ``${file:PATH}`` references in the config file at ``path`` name (relative to
    its directory, as :func:`read_config` reads them), in order, each once; none when ``path``
    cannot be read (what ``serve --watch`` watches besides ``path``)."""
    try:
        text = read_regular(Path(path), MAX_CONFIG_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ()
    base = Path(path).parent
    found = (base / m.group(2).strip() for m in _REF.finditer(text) if m.group(2) is not None)
    return tuple(dict.fromkeys(found))
