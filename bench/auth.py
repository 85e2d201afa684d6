"""``make bench``'s auth part: what authenticating callers and filtering lists per caller cost.

One 1-worker gateway on bench/run.py's 25-tool SDK upstream, with ``[auth.jwt]`` (RS256; the key
set served by bench/idp.py, the tokens minted here with the private half), ``[auth.introspection]``
(bench/idp.py's endpoint, which answers at once), two ``[[auth.static]]`` callers and two
``[[policy.rules]]``: ``all`` (scope ``mcp:write``: every tool) and ``half`` (scope ``mcp:read``
only: every other tool of the upstream's list, 13 of 25), and the same gateway without the rules.
Side by side:

  cached  a warm ``tools/list`` with a static token (``mcp:read mcp:write``: the whole list), the
          same with a JWT holding the same scopes, and with a static token holding ``mcp:read``
          only (the list filtered to 13 tools from the one shared entry), and the static token on
          the gateway without rules (the shared answer as it is): wrk (bench/mcp.lua) at
          ``--connections``, ``--rounds`` rounds of ``--duration`` s, the order rotated every
          round; ratios are medians over rounds of (JWT / static), (filtered / unfiltered) and
          (filtered / without rules) req/s. Every answer is checked first; the upstream's counts
          must not move. With 2+ CPUs the gateways run on the first CPU and wrk on the others.
  tokens  over one keep-alive connection, requests one after the other, in blocks that rotate:
          a warm static token, a JWT seen before, a JWT never seen (each request its own, RS256),
          an opaque token seen before (its introspection answer reused) and one never seen (each
          its own: one introspection each); 50 blocks of 50 requests per kind (quick: 10). The
          cost of a kind is its median latency minus the static token's, and its gateway CPU
          time per request (all its blocks' CPU time over their requests: the kernel counts it
          in 10 ms ticks) minus the static token's, in µs.
  verify  the gateway's ``JwtVerifier.verify`` of JWTs never seen, called in this process with
          the key already held: µs per token (the RS256 check and the claims, nothing else).
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from harness import (
    BENCH,
    HOST,
    MCP_PATH,
    PY,
    Conn,
    Fleet,
    fetch,
    free_port,
    gateway_argv,
    group_cpu_seconds,
    log,
    mcp_body,
    mcp_headers,
    median_run,
    percentile,
    run_async,
    run_summary,
    set_group_affinity,
    upstream_counts,
    wait_ready,
    wrk,
)

KID = "bench-rs256"
CLIENT = {"client_id": "mcp-gateway-bench", "client_secret": secrets.token_urlsafe(24)}
STATIC_ALL = "bench-static-all-" + secrets.token_urlsafe(16)
STATIC_HALF = "bench-static-half-" + secrets.token_urlsafe(16)
#: The wrk sides, in their first round's order (the reference first).
SIDES = ("static", "jwt", "filtered", "no_rules")
#: The timed kinds of the tokens measure (the reference first).
KINDS = ("static", "jwt_warm", "jwt_cold", "opaque_warm", "opaque_cold")


def message(body: bytes) -> dict[str, Any]:
    msg = json.loads(body)
    return msg if isinstance(msg, dict) else {}


class Issuer:
    """An RS256 key pair, its JWK Set, and JWT access tokens (RFC 9068) for one resource."""

    def __init__(self, issuer: str, resource: str) -> None:
        self.issuer, self.resource = issuer, resource
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        self.jwks = {"keys": [{**public, "kid": KID, "alg": "RS256", "use": "sig"}]}

    def token(self, subject: str, scope: str) -> str:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "aud": self.resource,
            "sub": subject,
            "scope": scope,
            "iat": now,
            "exp": now + 3600,
            "jti": secrets.token_urlsafe(12),
        }
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": KID, "typ": "at+jwt"})


def write_config(path: Path, port: int, up_port: int, idp_port: int, half: list[str] | None) -> None:
    """The auth part's gateway; ``half`` ``None``: the same without ``[[policy.rules]]``."""
    idp = f"http://{HOST}:{idp_port}"
    rules = (
        ""
        if half is None
        else '[[policy.rules]]\nname = "all"\nscopes = ["mcp:write"]\ntools = ["*"]\n\n'
        f'[[policy.rules]]\nname = "half"\nscopes = ["mcp:read"]\ntools = {json.dumps(half)}\n\n'
    )
    path.write_text(
        f'[listener]\nhost = "{HOST}"\nport = {port}\n\n'
        f'[[auth.static]]\ntoken = "{STATIC_ALL}"\nsubject = "bench-all"\nscopes = ["mcp:read", "mcp:write"]\n\n'
        f'[[auth.static]]\ntoken = "{STATIC_HALF}"\nsubject = "bench-half"\nscopes = ["mcp:read"]\n\n'
        f'[auth.jwt]\nissuer = "{idp}"\njwks_url = "{idp}/jwks"\nalgorithms = ["RS256"]\n\n'
        f'[auth.introspection]\nurl = "{idp}/introspect"\nclient_id = "{CLIENT["client_id"]}"\n'
        f'client_secret = "{CLIENT["client_secret"]}"\ncache_s = 3600\n\n'
        f'[auth.resource]\npublic_base_url = "http://{HOST}:{port}"\n\n{rules}'
        f'[upstreams.workspace]\nurl = "http://{HOST}:{up_port}/mcp"\n'
    )


def list_as(port: int, token: str, id_: object = "check") -> tuple[int, dict[str, str], bytes]:
    headers = {**mcp_headers("tools/list"), "Authorization": f"Bearer {token}"}
    return fetch(port, "POST", MCP_PATH, mcp_body("tools/list", id_), headers)


def check(port: int, token: str, tools: int) -> dict[str, Any]:
    """A warm ``tools/list`` as ``token``: 200, the caller's id, ``tools`` tools."""
    status, headers, body = list_as(port, token)
    result = (message(body).get("result") or {}) if status == 200 else {}
    names = [t.get("name") for t in result.get("tools", [])]
    return {
        "ok": status == 200 and len(names) == tools and message(body).get("id") == "check",
        "status": status,
        "cache_status": headers.get("cache-status", ""),
        "tools": len(names),
        "cache_scope": result.get("cacheScope"),
        "response_bytes": len(body),
        "response": None if status == 200 else body[:300].decode(errors="replace"),
    }


def cpu_plan(opts: Any) -> tuple[set[int] | None, set[int] | None]:
    cpus = sorted(os.sched_getaffinity(0))
    if not opts.pin or len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


def cached_runs(fleet: Fleet, targets: dict[str, tuple[Any, int, str]], up_port: int, opts: Any) -> dict[str, Any]:
    """wrk on each side of :data:`SIDES`: ``targets`` maps it to (gateway process, port, token)."""
    server_cpus, wrk_cpus = cpu_plan(opts)
    every_cpu = os.sched_getaffinity(0)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    procs = {proc.pid: proc for proc, _, _ in targets.values()}
    if server_cpus:
        for pid in procs:
            set_group_affinity(pid, server_cpus)
    before = upstream_counts(up_port)
    try:
        for r in range(opts.rounds):
            k = r % len(SIDES)
            for side in SIDES[k:] + SIDES[:k]:
                proc, port, token = targets[side]
                log(f"auth: warm tools/list, {side} caller (round {r + 1}/{opts.rounds})")
                runs[side].append(
                    wrk(
                        fleet,
                        f"http://{HOST}:{port}{MCP_PATH}",
                        "tools/list",
                        connections=opts.connections,
                        duration=opts.duration,
                        server=proc,
                        cpus=wrk_cpus,
                        authorization=f"Bearer {token}",
                    )
                )
    finally:
        if server_cpus:
            for pid in procs:
                set_group_affinity(pid, every_cpu)
    during = upstream_counts(up_port) - before

    def ratio(a: str, b: str) -> tuple[float, list[float], float | None]:
        pairs = list(zip(runs[a], runs[b], strict=True))
        ratios = [x["rps"] / y["rps"] for x, y in pairs]
        cpu = [y["cpu_us_per_request"] / x["cpu_us_per_request"] for x, y in pairs if x["cpu_us_per_request"]]
        return (
            round(statistics.median(ratios), 3),
            [round(x, 3) for x in ratios],
            round(statistics.median(cpu), 3) if cpu else None,
        )

    jwt_ratio, jwt_all, jwt_cpu = ratio("jwt", "static")
    filtered_ratio, filtered_all, filtered_cpu = ratio("filtered", "static")
    no_rules_ratio, no_rules_all, no_rules_cpu = ratio("filtered", "no_rules")
    rules_ratio, rules_all, rules_cpu = ratio("static", "no_rules")
    return {
        "connections": opts.connections,
        "rounds": opts.rounds,
        "duration_s": opts.duration,
        "cpus": {"gateway": sorted(server_cpus), "wrk": sorted(wrk_cpus or ())} if server_cpus else None,
        **{side: median_run(runs[side]) for side in SIDES},
        "jwt_ratio": jwt_ratio,
        "jwt_ratio_all": jwt_all,
        "jwt_cpu_ratio": jwt_cpu,
        "filtered_ratio": filtered_ratio,
        "filtered_ratio_all": filtered_all,
        "filtered_cpu_ratio": filtered_cpu,
        "filtered_to_no_rules_ratio": no_rules_ratio,
        "filtered_to_no_rules_ratio_all": no_rules_all,
        "filtered_to_no_rules_cpu_ratio": no_rules_cpu,
        "rules_ratio": rules_ratio,
        "rules_ratio_all": rules_all,
        "rules_cpu_ratio": rules_cpu,
        "upstream_requests_during": dict(during),
    }


async def _timed(port: int, pgid: int, plan: list[tuple[str, list[str]]]) -> dict[str, dict[str, list[float]]]:
    """Each (kind, tokens) of ``plan`` in turn over one connection: a ``tools/list`` per token,
    one after the other. Returns kind -> {"latency_s": [each request], "cpu_s": [each block, seconds]}."""
    out: dict[str, dict[str, list[float]]] = {kind: {"latency_s": [], "cpu_s": []} for kind in KINDS}
    async with Conn(port) as conn:
        for kind, tokens in plan:
            cpu_before = group_cpu_seconds(pgid)
            for i, token in enumerate(tokens):
                headers = {**mcp_headers("tools/list"), "Authorization": f"Bearer {token}"}
                started = time.perf_counter()
                status, _, body = await conn.post(MCP_PATH, mcp_body("tools/list", i), headers)
                out[kind]["latency_s"].append(time.perf_counter() - started)
                if status != 200:
                    raise RuntimeError(f"auth: tools/list with a {kind} token: HTTP {status} {body[:200]!r}")
            # CPU time comes in clock ticks (10 ms): summed over every block of a kind below.
            out[kind]["cpu_s"].append(group_cpu_seconds(pgid) - cpu_before)
    return out


def token_costs(
    proc: Any, port: int, idp_port: int, issuer: Issuer, tokens: dict[str, str], opts: Any
) -> dict[str, Any]:
    # Small blocks, rotated: every kind sees nearly the same machine. The CPU time's 10 ms ticks
    # are charged to whoever runs at the tick, so their sum over many blocks is still fair.
    blocks, per_block = (10, 50) if opts.quick else (50, 50)
    plan: list[tuple[str, list[str]]] = []
    for b in range(blocks):
        kinds = KINDS[b % len(KINDS) :] + KINDS[: b % len(KINDS)]
        for kind in kinds:
            if kind == "jwt_cold":
                batch = [issuer.token(f"bench-cold-{b}-{i}", "mcp:read mcp:write") for i in range(per_block)]
            elif kind == "opaque_cold":
                batch = [f"opaque-{secrets.token_urlsafe(24)}" for _ in range(per_block)]
            else:
                batch = [tokens[kind]] * per_block
            plan.append((kind, batch))
    log(f"auth: timed tools/list, {blocks} blocks of {per_block} requests per token kind")
    introspected_before = json.loads(fetch(idp_port, "GET", "/_counts")[2])["introspect"]
    timed = run_async(_timed(port, proc.pid, plan))
    introspected = json.loads(fetch(idp_port, "GET", "/_counts")[2])["introspect"] - introspected_before
    out: dict[str, Any] = {"blocks": blocks, "per_block": per_block, "introspections": introspected}

    def cpu_per_request(kind: str) -> float:
        return sum(timed[kind]["cpu_s"]) / len(timed[kind]["latency_s"])

    base_p50 = statistics.median(timed["static"]["latency_s"])
    base_cpu = cpu_per_request("static")
    for kind in KINDS:
        lat = timed[kind]["latency_s"]
        out[kind] = {
            "requests": len(lat),
            "p50_us": round(statistics.median(lat) * 1e6, 1),
            "p99_us": round(percentile(lat, 99) * 1e6, 1),
            "cpu_us_per_request": round(cpu_per_request(kind) * 1e6, 1),
            "added_p50_us": round((statistics.median(lat) - base_p50) * 1e6, 1),
            "added_cpu_us": round((cpu_per_request(kind) - base_cpu) * 1e6, 1),
        }
    return out


class _Keys:
    """The key set of :func:`verify_in_process`: the issuer's one key, never fetched."""

    def __init__(self, issuer: Issuer) -> None:
        self.key_ = jwt.PyJWK(issuer.jwks["keys"][0])

    async def key(self, kid: str | None) -> jwt.PyJWK | None:
        return self.key_ if kid == KID else None


def verify_in_process(issuer: Issuer, opts: Any) -> dict[str, Any]:
    """The gateway's own JWT verification (``gateway.auth.jwts.JwtVerifier.verify``) of tokens
    never seen, in this process, its key set already held: µs per token, median of batches."""
    from gateway.auth.jwts import JwtVerifier
    from gateway.auth.tokens import token_context
    from gateway.config.auth import JwtConfig

    config = JwtConfig(issuer=issuer.issuer, jwks_url=f"{issuer.issuer}/jwks", algorithms=("RS256",))
    verifier = JwtVerifier(config, keys=_Keys(issuer))  # type: ignore[arg-type]
    batches, size = (5, 100) if opts.quick else (20, 100)
    tokens = [[issuer.token(f"bench-v-{b}-{i}", "mcp:read").encode() for i in range(size)] for b in range(batches)]

    async def timed() -> list[float]:
        per_token = []
        for batch in tokens:
            started = time.perf_counter()
            for token in batch:
                verdict = await verifier.verify(token, token_context(token))
                if verdict.outcome != "ok":
                    raise RuntimeError(f"auth: in-process verification refused a bench token: {verdict}")
            per_token.append((time.perf_counter() - started) / size)
        return per_token

    per_token = run_async(timed())
    return {"tokens": batches * size, "us_per_token": round(statistics.median(per_token) * 1e6, 1)}


def run(fleet: Fleet, workdir: Path, up_port: int, opts: Any) -> dict[str, Any]:
    """The cached runs, then the token costs, on one fresh 1-worker gateway on ``up_port``."""
    port, idp_port = free_port(), free_port()
    resource = f"http://{HOST}:{port}{MCP_PATH}"
    issuer = Issuer(f"http://{HOST}:{idp_port}", resource)
    idp_dir = workdir / "idp"
    idp_dir.mkdir(exist_ok=True)
    (idp_dir / "jwks.json").write_text(json.dumps(issuer.jwks))
    (idp_dir / "client.json").write_text(json.dumps(CLIENT))
    claims = {"sub": "bench-introspected", "scope": "mcp:read mcp:write", "aud": resource, "iss": issuer.issuer}
    (idp_dir / "claims.json").write_text(json.dumps(claims))
    idp = fleet.start("idp", [PY, str(BENCH / "idp.py"), str(idp_port), str(idp_dir)])
    wait_ready(fleet, "idp", idp, lambda: fetch(idp_port, "GET", "/_counts")[0] == 200)

    upstream = message(fetch(up_port, "POST", "/mcp", mcp_body("tools/list"), mcp_headers("tools/list"))[2])
    names = [t["name"] for t in upstream["result"]["tools"]]
    half = names[::2]
    config, plain_config = workdir / "gateway-auth.toml", workdir / "gateway-auth-no-rules.toml"
    plain_port = free_port()
    write_config(config, port, up_port, idp_port, half)
    write_config(plain_config, plain_port, up_port, idp_port, None)
    name, plain_name = "gateway-auth", "gateway-auth-no-rules"
    proc = fleet.start(name, gateway_argv(config, 1, opts.log_level, opts.loop))
    plain = fleet.start(plain_name, gateway_argv(plain_config, 1, opts.log_level, opts.loop))
    tokens = {
        "static": STATIC_ALL,
        "filtered": STATIC_HALF,
        "jwt": issuer.token("bench-jwt", "mcp:read mcp:write"),
        "opaque_warm": f"opaque-{secrets.token_urlsafe(24)}",
    }
    tokens["jwt_warm"] = tokens["jwt"]
    out: dict[str, Any] = {"workers": 1, "tools": len(names), "half": len(half)}
    try:
        wait_ready(fleet, name, proc, lambda: fetch(port, "GET", "/readyz")[0] == 200)
        wait_ready(fleet, plain_name, plain, lambda: fetch(plain_port, "GET", "/readyz")[0] == 200)
        log("auth: warming tools/list for each caller")
        for i in range(20):
            for token in tokens.values():
                list_as(port, token, i)
            list_as(plain_port, STATIC_ALL, i)
        out["checks"] = {
            "static": check(port, STATIC_ALL, len(names)),
            "jwt": check(port, tokens["jwt"], len(names)),
            "filtered": check(port, STATIC_HALF, len(half)),
            "opaque": check(port, tokens["opaque_warm"], len(names)),
            "no_rules": check(plain_port, STATIC_ALL, len(names)),
        }
        for side, c in out["checks"].items():
            if not c["ok"]:
                raise RuntimeError(f"auth: the {side} caller's tools/list is not what it should be: {c}")
        targets = {side: (proc, port, tokens[side]) for side in ("static", "jwt", "filtered")}
        targets["no_rules"] = (plain, plain_port, STATIC_ALL)
        out["cached"] = cached_runs(fleet, targets, up_port, opts)
        out["tokens"] = token_costs(proc, port, idp_port, issuer, tokens, opts)
        out["verify_in_process"] = verify_in_process(issuer, opts)
    finally:
        fleet.stop(proc)
        fleet.stop(plain)
        fleet.stop(idp)
    return out


# -- report ---------------------------------------------------------------------------------------------


def table(result: dict[str, Any], targets: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """The "Auth" table: its title, header and rows (no rows without the auth part)."""
    a = result.get("auth")
    if not a or "cached" not in a:
        return [], [], []
    c, t, checks = a["cached"], a["tokens"], a["checks"]
    pin = f"; gateway on CPU {c['cpus']['gateway']}, wrk on CPU {c['cpus']['wrk']}" if c["cpus"] else ""
    title = [
        f"Auth (1 worker, `[auth.jwt]` RS256, `[auth.introspection]`, 2 policy rules; warm lists: wrk, 1 thread,"
        f" {c['connections']} connections, {c['rounds']} rounds of {c['duration_s']:g} s, the order rotated{pin};"
        f" tokens: 1 connection, {t['blocks']} blocks of {t['per_block']} requests per kind, rotated)"
    ]
    header = ["| measure | figure | target |", "|---|---|---|"]
    rows = [
        (f"warm `tools/list`, static token ({checks['static']['tools']} tools)", run_summary(c["static"]), ""),
        (f"the same, a JWT caller ({checks['jwt']['tools']} tools)", run_summary(c["jwt"]), ""),
        (
            f"the same, filtered by a rule keeping {a['half']} of {a['tools']} tools"
            f" ({checks['filtered']['response_bytes']} B, `cacheScope` {checks['filtered']['cache_scope']})",
            run_summary(c["filtered"]),
            "",
        ),
        (
            "JWT / static req/s, median of rounds (range); CPU ratio",
            f"{c['jwt_ratio']:.2f} ({min(c['jwt_ratio_all']):.2f}-{max(c['jwt_ratio_all']):.2f}); {c['jwt_cpu_ratio']}",
            f">= {targets['auth_jwt_ratio_min']}",
        ),
        (
            "filtered / unfiltered req/s, median of rounds (range); CPU ratio",
            f"{c['filtered_ratio']:.2f} ({min(c['filtered_ratio_all']):.2f}-{max(c['filtered_ratio_all']):.2f});"
            f" {c['filtered_cpu_ratio']}",
            f">= {targets['auth_filtered_ratio_min']}",
        ),
        (
            f"the same, static token, on a gateway without `[[policy.rules]]` (the shared answer as it is,"
            f" `cacheScope` {checks['no_rules']['cache_scope']})",
            run_summary(c["no_rules"]),
            "",
        ),
        (
            "filtered / without rules req/s, median of rounds (range); CPU ratio",
            f"{c['filtered_to_no_rules_ratio']:.2f} ({min(c['filtered_to_no_rules_ratio_all']):.2f}-"
            f"{max(c['filtered_to_no_rules_ratio_all']):.2f}); {c['filtered_to_no_rules_cpu_ratio']}",
            "",
        ),
        (
            "with rules (the whole list) / without rules req/s, median of rounds (range); CPU ratio",
            f"{c['rules_ratio']:.2f} ({min(c['rules_ratio_all']):.2f}-{max(c['rules_ratio_all']):.2f});"
            f" {c['rules_cpu_ratio']}",
            "",
        ),
        ("upstream requests during the list runs", str(sum(c["upstream_requests_during"].values())), "0"),
    ]
    labels = {
        "jwt_warm": "a JWT seen before",
        "jwt_cold": "a JWT never seen (RS256 verified)",
        "opaque_warm": "an opaque token seen before (introspection answer reused)",
        "opaque_cold": "an opaque token never seen (one introspection, loopback)",
    }
    s = t["static"]
    rows.append(
        (
            "static token, 1 connection: p50 / p99 µs, gateway CPU µs/req",
            f"{s['p50_us']:.0f} / {s['p99_us']:.0f}, {s['cpu_us_per_request']:.0f}",
            "",
        )
    )
    for kind, label in labels.items():
        k = t[kind]
        rows.append(
            (
                f"{label}: added p50 µs, added gateway CPU µs/req (p50 / p99 µs)",
                f"{k['added_p50_us']:+.0f}, {k['added_cpu_us']:+.0f} ({k['p50_us']:.0f} / {k['p99_us']:.0f})",
                "",
            )
        )
    rows.append(("introspections during the timed requests", str(t["introspections"]), ""))
    v = a.get("verify_in_process")
    if v:
        rows.append(
            (
                f"in this process: `JwtVerifier.verify` of a JWT never seen (RS256, key held), µs, median of"
                f" batches ({v['tokens']} tokens)",
                f"{v['us_per_token']:.0f}",
                "",
            )
        )
    return title, header, [f"| {m} | {f} | {x} |" for m, f, x in rows]


def verdicts(result: dict[str, Any], targets: dict[str, Any]) -> dict[str, bool]:
    a = result.get("auth")
    if not a or "cached" not in a:
        return {}
    c, t = a["cached"], a["tokens"]
    cold_opaque = t["opaque_cold"]["requests"]
    return {
        "jwt_ratio_ok": c["jwt_ratio"] >= targets["auth_jwt_ratio_min"],
        "filtered_ratio_ok": c["filtered_ratio"] >= targets["auth_filtered_ratio_min"],
        "no_upstream_requests_ok": sum(c["upstream_requests_during"].values()) == 0,
        "no_errors_ok": all(c[s]["non_2xx"] == 0 and c[s]["socket_errors"] == 0 for s in SIDES),
        # Each never-seen opaque token introspected once; the one seen before never again.
        "introspections_ok": t["introspections"] == cold_opaque,
    }
