"""The floor under any aiohttp manager, for ``bench_daemons``: a server that answers heartbeats
and does nothing else.

Run as its own process (the benchmark pins it to the manager's core)::

    python -m bench._aiohttp_floor --port PORT [--decode]

``POST /v1/heartbeat`` reads the body and answers an empty ``CommandBatch`` acknowledging the
body's ``seq`` (found by a regular expression: what the load generator checks). With
``--decode`` the body is first decoded and checked by ``specon.wire.protocol.decode``, as the
manager does. No authentication, no cluster state, no metrics: what is left is aiohttp's own
cost per request, and that plus the protocol's decoding.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from aiohttp import web

from specon.wire import protocol
from specon.wire.protocol import Heartbeat

_SEQ = re.compile(rb'"seq":(\d+)')
_HEAD = b'{"version":"%s","kind":"CommandBatch","manager_time":1.0,"policy_generation":1,"commands":[],"ack":'


def app(decode: bool) -> web.Application:
    head = _HEAD % protocol.VERSION.encode()

    async def heartbeat(request: web.Request) -> web.Response:
        body = await request.read()
        if decode:
            protocol.decode(body, Heartbeat)
        seq = _SEQ.search(body)
        if seq is None:
            return web.Response(status=400)
        return web.Response(body=head + seq.group(1) + b"}", content_type=protocol.CONTENT_TYPE)

    a = web.Application()
    a.router.add_post(protocol.HEARTBEAT_PATH, heartbeat)
    return a


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench._aiohttp_floor", description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    p.add_argument("--decode", action="store_true", help="decode and check each body as the manager does")
    args = p.parse_args(argv)
    web.run_app(app(args.decode), host="127.0.0.1", port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
