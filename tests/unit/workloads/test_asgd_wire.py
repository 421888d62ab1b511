"""The parameter server's framing: round trips, and every bad frame a clear error in bounded time."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from specon.workloads.asgd.wire import (
    HEADER,
    MAGIC,
    Frame,
    FrameError,
    Kind,
    PeerClosedError,
    WireError,
    WireTimeoutError,
    decode_header,
    encode_header,
    recv_frame,
    send_frame,
    tune,
)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_a_tensor_round_trips_with_its_header_fields(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    grad = np.arange(1000, dtype=np.float32)
    # Sent from a thread: 4 kB exceeds no buffer here, but the pattern must not deadlock anyway.
    t = threading.Thread(
        target=send_frame,
        args=(a, Frame(Kind.GRAD, 7, 42, 1.5, grad.view(np.uint8).data)),
        kwargs={"timeout": 5},
    )
    t.start()
    got = recv_frame(b, timeout=5)
    t.join()
    assert (got.kind, got.seq, got.version, got.value) == (Kind.GRAD, 7, 42, 1.5)
    assert np.array_equal(np.frombuffer(got.payload, dtype="<f4"), grad)
    assert got.started <= got.ended


def test_the_receive_buffer_is_reused_and_grown(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    buf = bytearray(4)
    send_frame(a, Frame(Kind.PARAMS, payload=b"x" * 16), timeout=5)
    got = recv_frame(b, timeout=5, buffer=buf)
    assert bytes(got.payload) == b"x" * 16 and len(buf) == 16
    send_frame(a, Frame(Kind.PARAMS, payload=b"yy"), timeout=5)
    assert bytes(recv_frame(b, timeout=5, buffer=buf).payload) == b"yy"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (HEADER.pack(b"XX", 2, 0, 0, 0, 0.0, 0), "bad magic"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\0\0\0\0\0", "bad magic"),
        (HEADER.pack(MAGIC, 99, 0, 0, 0, 0.0, 0), "unknown frame kind 99"),
        (HEADER.pack(MAGIC, 2, 1, 0, 0, 0.0, 0), "unknown flags"),
        (HEADER.pack(MAGIC, 3, 0, 0, 0, 0.0, 1 << 40), "over the limit"),
        (HEADER.pack(MAGIC, 1, 0, 0, 0, 0.0, 8), "HELLO carries no payload"),
    ],
)
def test_a_bad_header_is_a_frame_error_at_once(
    pair: tuple[socket.socket, socket.socket], raw: bytes, message: str
) -> None:
    a, b = pair
    a.sendall(raw[: HEADER.size])
    t0 = time.monotonic()
    with pytest.raises(FrameError, match=message):
        recv_frame(b, timeout=5)
    assert time.monotonic() - t0 < 1


def test_the_receiver_sets_the_payload_limit() -> None:
    raw = encode_header(Frame(Kind.GRAD, payload=b"\0" * 100))
    assert decode_header(raw)[4] == 100
    with pytest.raises(FrameError, match="GRAD payload of 100 bytes is over the limit of 99"):
        decode_header(raw, max_payload=99)
    with pytest.raises(FrameError, match="a header is 32 bytes"):
        decode_header(raw[:10])


def test_a_close_between_frames_and_one_mid_frame_differ(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.close()
    with pytest.raises(PeerClosedError) as clean:
        recv_frame(b, timeout=5)
    assert not clean.value.mid_frame

    c, d = socket.socketpair()
    c.sendall(encode_header(Frame(Kind.PARAMS, payload=b"\0" * 1000)) + b"\0" * 10)
    c.close()
    with pytest.raises(PeerClosedError, match="mid-frame \\(10 of 1000 bytes\\)") as cut:
        recv_frame(d, timeout=5)
    assert cut.value.mid_frame
    d.close()


def test_a_silent_peer_times_out(pair: tuple[socket.socket, socket.socket]) -> None:
    _, b = pair
    t0 = time.monotonic()
    with pytest.raises(WireTimeoutError, match="0 of 32 bytes"):
        recv_frame(b, timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 1


def test_a_dripping_peer_cannot_stretch_the_deadline(pair: tuple[socket.socket, socket.socket]) -> None:
    """One byte every 50 ms keeps each recv under any per-call timeout: the frame's deadline holds."""
    a, b = pair
    a.sendall(encode_header(Frame(Kind.PARAMS, payload=b"\0" * 100)))
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(0.05):
            try:
                a.send(b"\0")
            except OSError:
                return

    t = threading.Thread(target=drip)
    t.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(WireTimeoutError, match="of 100 bytes"):
            recv_frame(b, timeout=0.4)
    finally:
        stop.set()
        t.join()
    assert time.monotonic() - t0 < 1


def test_a_send_the_peer_does_not_read_times_out(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    with pytest.raises(WireTimeoutError, match=r"PARAMS frame not sent within 0\.2s"):
        send_frame(a, Frame(Kind.PARAMS, payload=b"\0" * (64 << 20)), timeout=0.2)


def test_the_header_is_32_bytes_network_order() -> None:
    raw = encode_header(Frame(Kind.GRAD, seq=1, version=2, value=0.5, payload=b"abcd"))
    assert len(raw) == 32 and raw[:2] == b"AS" and raw[2] == 3
    assert struct.unpack("!Q", raw[-8:]) == (4,)


def test_tune_turns_nagle_off_and_sets_the_congestion_control_asked_for() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        tune(s)
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        system = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0")
        # The system's own choice is always allowed on a socket; an unknown name is refused.
        tune(s, system.decode())
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0") == system
        with pytest.raises(WireError, match="'no-such-cc' refused"):
            tune(s, "no-such-cc")
