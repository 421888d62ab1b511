"""The parameter server's framing over TCP: a fixed 32-byte header, then the payload.

Header (network byte order): magic ``b"AS"``, kind (1 byte), flags (1 byte, 0), ``seq``
(uint32: the worker's mini-batch number), ``version`` (uint64: the parameters' version),
``value`` (float64: the mini-batch's loss on a gradient), payload length (uint64). Payloads
are raw little-endian float32 vectors (parameters or a gradient), never pickled.

Every read has a deadline for the whole frame, not per ``recv`` call: a peer that stalls or
drips bytes gets a ``WireTimeoutError``, never a hang. A frame that cannot be ours (bad magic,
unknown kind, a payload over the receiver's limit) is a ``FrameError``; the peer closing the
connection is ``PeerClosedError`` (``mid_frame`` says whether it cut a frame short).
"""

from __future__ import annotations

import enum
import socket
import struct
import time
from dataclasses import dataclass

MAGIC = b"AS"
HEADER = struct.Struct("!2sBBIQdQ")
# A gradient or parameter vector over this is refused unless the receiver raises the limit.
MAX_PAYLOAD = 1 << 30


class Kind(enum.IntEnum):
    """What a frame carries."""

    HELLO = 1  # worker -> PS: ``seq`` is the worker's id; no payload
    PARAMS = 2  # PS -> worker: the parameters at ``version``
    GRAD = 3  # worker -> PS: a gradient computed at ``version``, its loss in ``value``
    BYE = 4  # PS -> worker: training is over; no payload


class WireError(Exception):
    """The connection cannot carry on; the message says why."""


class FrameError(WireError):
    """Bytes that are not a frame of this protocol."""


class WireTimeoutError(WireError):
    """A frame did not arrive (or could not be sent) within its deadline."""


class PeerClosedError(WireError):
    """The peer closed the connection."""

    def __init__(self, message: str, *, mid_frame: bool) -> None:
        super().__init__(message)
        self.mid_frame = mid_frame


@dataclass(frozen=True, slots=True)
class Frame:
    """One message; ``payload`` is a view on the receiver's buffer, valid until its next read."""

    kind: Kind
    seq: int = 0
    version: int = 0
    value: float = 0.0
    payload: memoryview | bytes = b""
    # When the header was read and when the last payload byte was (time.monotonic()).
    started: float = 0.0
    ended: float = 0.0


def encode_header(frame: Frame) -> bytes:
    """The 32-byte header of ``frame`` (its payload follows it on the wire)."""
    return HEADER.pack(
        MAGIC, int(frame.kind), 0, frame.seq, frame.version, frame.value, memoryview(frame.payload).nbytes
    )


def decode_header(raw: bytes, *, max_payload: int = MAX_PAYLOAD) -> tuple[Kind, int, int, float, int]:
    """(kind, seq, version, value, payload length) of a header, or ``FrameError``."""
    if len(raw) != HEADER.size:
        raise FrameError(f"a header is {HEADER.size} bytes, got {len(raw)}")
    magic, kind, flags, seq, version, value, length = HEADER.unpack(raw)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r} (expected {MAGIC!r}): the peer does not speak this protocol")
    try:
        k = Kind(kind)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind}") from None
    if flags != 0:
        raise FrameError(f"unknown flags {flags:#x}")
    if length > max_payload:
        raise FrameError(f"{k.name} payload of {length} bytes is over the limit of {max_payload}")
    if k in (Kind.HELLO, Kind.BYE) and length:
        raise FrameError(f"{k.name} carries no payload, got {length} bytes")
    return k, seq, version, value, length


def _recv_into(sock: socket.socket, view: memoryview, deadline: float, *, started: bool) -> None:
    got = 0
    while got < len(view):
        left = deadline - time.monotonic()
        if left <= 0:
            raise WireTimeoutError(f"frame incomplete at its deadline: {got} of {len(view)} bytes")
        sock.settimeout(left)
        try:
            n = sock.recv_into(view[got:])
        except TimeoutError:
            raise WireTimeoutError(f"frame incomplete at its deadline: {got} of {len(view)} bytes") from None
        except OSError as exc:
            raise WireError(f"receive failed: {exc}") from exc
        if n == 0:
            mid = started or got > 0
            raise PeerClosedError(
                "the peer closed the connection"
                + (f" mid-frame ({got} of {len(view)} bytes)" if mid else ""),
                mid_frame=mid,
            )
        got += n


def recv_frame(
    sock: socket.socket,
    *,
    timeout: float,
    buffer: bytearray | None = None,
    max_payload: int = MAX_PAYLOAD,
) -> Frame:
    """Read one frame within ``timeout`` seconds. The payload lands in ``buffer`` (reused:
    grown when short) or a new one; the returned view covers exactly the payload."""
    deadline = time.monotonic() + timeout
    raw = bytearray(HEADER.size)
    _recv_into(sock, memoryview(raw), deadline, started=False)
    started = time.monotonic()
    kind, seq, version, value, length = decode_header(bytes(raw), max_payload=max_payload)
    if buffer is None:
        buffer = bytearray(length)
    elif len(buffer) < length:
        buffer.extend(bytes(length - len(buffer)))
    view = memoryview(buffer)[:length]
    _recv_into(sock, view, deadline, started=True)
    return Frame(kind, seq, version, value, view, started, time.monotonic())


def send_frame(sock: socket.socket, frame: Frame, *, timeout: float) -> None:
    """Write ``frame``; ``WireTimeoutError`` if it is not all handed to the kernel in time."""
    sock.settimeout(timeout)  # since Python 3.5 the whole sendall's limit
    try:
        sock.sendall(encode_header(frame))
        if frame.payload:
            sock.sendall(frame.payload)
    except TimeoutError:
        raise WireTimeoutError(f"{frame.kind.name} frame not sent within {timeout:g}s") from None
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise PeerClosedError(f"the peer closed the connection: {exc}", mid_frame=True) from exc
    except OSError as exc:
        raise WireError(f"send failed: {exc}") from exc


def tune(sock: socket.socket, congestion: str | None = None) -> None:
    """No Nagle delay: a frame's last segment must not wait for the previous one's ACK. With
    ``congestion``, that TCP congestion control on this socket (``WireError`` if refused)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if congestion:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion.encode())
        except OSError as exc:
            raise WireError(
                f"TCP congestion control {congestion!r} refused: {exc} (not loaded, or not root and "
                "not in net.ipv4.tcp_allowed_congestion_control)"
            ) from None
