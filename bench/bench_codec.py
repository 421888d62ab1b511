"""Heartbeat decoding: specon's codec against msgspec and pydantic v2, speed and error quality.

The payloads are the daemon benchmark's realistic heartbeats (``bench._heartbeat_load``:
a mix of categories, resources, job labels) of agents with 8 and with 100 containers,
encoded once with ``specon.wire.protocol.encode``. Measured, in µs per heartbeat (median of
several rounds over 200 distinct agents' heartbeats, CPU time of this thread):

* ``protocol.decode``: what the manager runs per heartbeat (msgspec's fast path,
  ``specon.wire.fastpath``, for a well-formed message of this version; the semantic checks);
* ``protocol.decode`` without the fast path: the codec's path, which every body the fast
  path refuses still takes (UTF-8, ``json.loads`` with the finite-number hooks, envelope and
  version, the codec, the semantic checks);
* the codec's own share: ``json.loads`` + ``codec.from_data`` (no checks);
* when installed, msgspec (``msgspec.json.Decoder(Heartbeat)``) and pydantic v2
  (``TypeAdapter(Heartbeat).validate_json``, lax and ``strict=True``), all decoding
  straight into the same dataclasses (the envelope's keys are ignored), i.e. parse and
  convert, no checks.

Then one heartbeat with two wrong fields (``containers[3].category`` and
``containers[5].step``) is decoded by each, and the error is shown: whether it names the
field's path and whether it lists both problems.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

from bench._heartbeat_load import heartbeat
from bench.figures import Figure
from specon.wire import codec, fastpath, protocol
from specon.wire.protocol import Heartbeat

AGENTS = 200
NOW = 1_700_000_000.0


def _payloads(containers: int) -> list[bytes]:
    rng = random.Random(containers)
    return [protocol.encode(heartbeat(i, containers, rng, NOW)) for i in range(AGENTS)]


def _per_call_us(fn: Callable[[bytes], object], payloads: Sequence[bytes], rounds: int) -> float:
    """Median over ``rounds`` of the CPU µs per decode of every payload."""
    for p in payloads[:10]:
        fn(p)  # warm: compiled converters, caches
    times = []
    for _ in range(rounds):
        t = time.thread_time()
        for p in payloads:
            fn(p)
        times.append((time.thread_time() - t) / len(payloads) * 1e6)
    return statistics.median(times)


def _codec_only(raw: bytes) -> object:
    obj = json.loads(raw)
    del obj["version"], obj["kind"]
    return codec.from_data(Heartbeat, obj)


def _codec_path(raw: bytes) -> object:
    with mock.patch.object(fastpath, "decode", _declined):
        return protocol.decode(raw, Heartbeat)


def _declined(*_args: object) -> None:
    return None  # the fast path says: take the codec's path


def _alternatives() -> dict[str, Callable[[bytes], object]]:
    out: dict[str, Callable[[bytes], object]] = {}
    try:
        import msgspec  # noqa: PLC0415 (optional: installed only to measure)
    except ImportError:
        pass
    else:
        out["msgspec"] = msgspec.json.Decoder(Heartbeat).decode
    try:
        from pydantic import TypeAdapter  # noqa: PLC0415
    except ImportError:
        pass
    else:
        adapter = TypeAdapter(Heartbeat)
        out["pydantic v2"] = adapter.validate_json  # lax: coerces "12" to 12
        out["pydantic v2 strict"] = lambda raw: adapter.validate_json(raw, strict=True)
    return out


def _broken(raw: bytes) -> bytes:
    """The heartbeat with two wrong fields, deep in its container list."""
    obj: dict[str, Any] = json.loads(raw)
    obj["containers"][3]["category"] = "convreged"
    obj["containers"][5]["step"] = "12"
    return json.dumps(obj).encode()


def _error_of(fn: Callable[[bytes], object], raw: bytes) -> str:
    try:
        fn(raw)
    except Exception as exc:  # each library raises its own type
        return " ".join(str(exc).split())
    return "(accepted!)"


def _quality(text: str) -> str:
    paths = ("containers[3].category", "containers.3.category", "$.containers[3].category")
    both = ("containers[5].step", "containers.5.step", "$.containers[5].step")
    named = any(p in text for p in paths) or any(p in text for p in both)
    listed = any(p in text for p in paths) and any(p in text for p in both)
    return f"path named: {'yes' if named else 'no'}, both problems: {'yes' if listed else 'no'}"


def run(quick: bool) -> list[Figure]:
    rounds = 3 if quick else 11
    alternatives = _alternatives()
    figures: list[Figure] = []
    for containers in (8, 100):
        payloads = _payloads(containers)
        size = statistics.fmean(len(p) for p in payloads)
        for p in payloads[:3]:  # every decoder reads the same values
            want = protocol.decode(p, Heartbeat)
            for name, fn in alternatives.items():
                if fn(p) != want:
                    raise RuntimeError(f"{name} decodes a heartbeat differently from specon.wire.protocol")
        cases: list[tuple[str, Callable[[bytes], object]]] = [
            ("protocol.decode", lambda raw: protocol.decode(raw, Heartbeat)),
            ("protocol.decode, codec path", _codec_path),
            ("json.loads + codec.from_data", _codec_only),
            *alternatives.items(),
        ]
        base = None
        for name, fn in cases:
            us = _per_call_us(fn, payloads, rounds)
            base = us if base is None else base
            figures.append(
                Figure(
                    name=f"{containers}-container heartbeat decode: {name}",
                    value=us,
                    unit="µs",
                    detail=f"{1e6 / us:,.0f}/s on one core; {us / base:.2f}x protocol.decode; "
                    f"{size / 1000:.1f} kB each",
                )
            )
    bad = _broken(_payloads(8)[0])
    for name, fn in [("protocol.decode", lambda raw: protocol.decode(raw, Heartbeat)), *alternatives.items()]:
        text = _error_of(fn, bad)
        print(f"  {name} on a heartbeat with 2 wrong fields: {text[:400]}", flush=True)
        figures.append(
            Figure(
                name=f"error quality: {name}",
                value=float(text.count("containers")),
                unit="paths",
                detail=f"{_quality(text)}; {text[:160]}",
            )
        )
    return figures
