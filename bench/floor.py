"""The floor for a Python server: a bare aiohttp app answering every POST with fixed bytes.

Usage: python bench/floor.py --port PORT --body FILE [--body METHOD=FILE ...] [--workers N]

It reads the request body (as any server must) and answers with the bytes of FILE, or, when
the request's ``Mcp-Method`` header names a METHOD given as ``METHOD=FILE``, with those bytes
(so the ``server/discover`` figure is compared with a floor of the same response size).
It runs exactly like the gateway does: the same event loop (``gateway.cli.new_event_loop``;
``--loop`` as the gateway's, uvloop when installed by default), the same ``web.run_app``
options, and the same listening socket: bound once by the parent and, for ``--workers N``,
accepted on by N forked processes (``gateway.cli.bind_listeners``/``fork_workers``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.cli import LOOPS, bind_listeners, fork_workers, new_event_loop


def make_app(default: bytes, by_method: dict[str, bytes]) -> web.Application:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        body = by_method.get(request.headers.get("Mcp-Method", ""), default) if by_method else default
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--loop", choices=LOOPS, default="auto", help="as the gateway's --loop")
    parser.add_argument("--body", action="append", required=True, help="FILE (default answer) or METHOD=FILE")
    args = parser.parse_args()
    default = b""
    by_method: dict[str, bytes] = {}
    for spec in args.body:
        method, sep, path = spec.partition("=")
        if sep:
            by_method[method] = Path(path).read_bytes()
        else:
            default = Path(spec).read_bytes()

    socks = bind_listeners(args.host, args.port)

    def run_one(_index: int) -> None:
        web.run_app(
            make_app(default, by_method),
            sock=socks,
            handler_cancellation=True,
            access_log=None,
            print=None,
            loop=new_event_loop(args.loop),
        )

    if args.workers <= 1:
        run_one(0)
        return 0
    return fork_workers(args.workers, run_one, listeners=socks)


if __name__ == "__main__":
    sys.exit(main())
