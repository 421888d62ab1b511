"""The channel between the manager's front processes and its decider (``--fronts``).

A front (``specon_manager.front``) serves the manager's port; a heartbeat it has
authenticated, decoded and checked in full goes to the decider over one Unix stream socket
as a frame, and the decider's answer comes back on the same socket as a frame with the same
id. Frames are ``length (u32) | id (u64) | kind (1 byte) | payload``:

* ``HEARTBEAT``, front to decider: the ``Heartbeat`` as msgpack (msgspec; the front has
  checked it, and only the manager's own processes can reach the socket);
* ``REJECTED``, front to decider: a request the front refused itself (a body it could not
  read), the reason as UTF-8, so ``specon_rejected_total`` still counts it; no answer;
* ``ANSWER``, decider to front: the JSON ``CommandBatch`` to send back;
* ``ANSWER_AS_LEADER``: the same, from a leader under ``--leader-elect`` (the front adds the
  ``Specon-Role`` header the leader's other answers carry);
* ``DECLINED``, decider to front: the decider will not answer this one here (a standby, a
  heartbeat refused by the cluster's state): the front sends the HTTP request itself, and
  the decider's HTTP handler answers it exactly as without fronts (errors, logs, counters).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

HEARTBEAT = b"H"
REJECTED = b"R"
ANSWER = b"A"
ANSWER_AS_LEADER = b"L"
DECLINED = b"D"
KINDS = frozenset({HEARTBEAT, REJECTED, ANSWER, ANSWER_AS_LEADER, DECLINED})

_HEAD = struct.Struct("!IQc")
HEAD_SIZE = _HEAD.size
# Far above any heartbeat the manager accepts (messaging.max_body_bytes); a frame over it is
# a broken peer, and the connection is closed.
MAX_FRAME = 64 << 20

BEATS_SOCKET = "beats.sock"  # the frames
HTTP_SOCKET = "http.sock"  # the decider's HTTP app, for every request a front does not answer


class FrameError(ValueError):
    """A frame that cannot be one: the peer is not a front (or not this version of one)."""


def frame(ident: int, kind: bytes, payload: bytes) -> bytes:
    return _HEAD.pack(len(payload), ident, kind) + payload


class Frames:
    """Splits a byte stream into ``(id, kind, payload)`` frames, as its bytes arrive."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes, bytes]]:
        """The frames ``data`` completes; ``FrameError`` for a frame no front sends."""
        self._buf += data
        at = 0
        buf = self._buf
        try:
            while len(buf) - at >= HEAD_SIZE:
                size, ident, kind = _HEAD.unpack_from(buf, at)
                if size > MAX_FRAME or kind not in KINDS:
                    raise FrameError(f"not a relay frame (kind {kind!r}, {size} bytes)")
                end = at + HEAD_SIZE + size
                if len(buf) < end:
                    break
                yield ident, kind, bytes(buf[at + HEAD_SIZE : end])
                at = end
        finally:
            del buf[:at]
