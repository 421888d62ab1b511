"""The loss window of protocol 1.3: its limits, and agents of 1.2 that know nothing of it (a 1.2
peer reading 1.3 ignores the new fields: the minor-version rule, tested in test_protocol)."""

from __future__ import annotations

import json

import pytest

from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire import protocol
from specon.wire.limits import MAX_WINDOW_POINTS
from specon.wire.protocol import ContainerReport, Heartbeat, ProtocolError
from specon.wire.status import ContainerStatus, LossWindow, Status


def _heartbeat(window: LossWindow | None) -> Heartbeat:
    return Heartbeat(
        worker=WorkerId("w0"),
        address="127.0.0.1:7701",
        seq=1,
        sent_at=1.0,
        capacity=Resources(cpu=1.0),
        usage=0.5,
        containers=(ContainerReport(id=ContainerId("job"), category=Category.PROGRESSING, window=window),),
    )


def _body(window: dict[str, object]) -> dict[str, object]:
    body = json.loads(protocol.encode(_heartbeat(None)))
    body["containers"][0]["window"] = window
    return body  # type: ignore[no-any-return]


def test_a_window_travels_and_comes_back_equal() -> None:
    w = LossWindow(
        first_step=10, last_step=640, loss=(2.5, 1.25, 0.5), steps_per_second=12.5, metric="val_loss"
    )
    hb = _heartbeat(w)
    assert protocol.decode(protocol.encode(hb), Heartbeat) == hb


@pytest.mark.parametrize(
    ("window", "path", "words"),
    [
        ({"first_step": 0, "last_step": 1, "loss": [1.0] * (MAX_WINDOW_POINTS + 1)}, "loss", "more than 64"),
        ({"first_step": -1, "last_step": 1}, "first_step", "must be within"),
        ({"first_step": 0, "last_step": 1, "steps_per_second": -2.0}, "steps_per_second", "must be within"),
        ({"first_step": 0, "last_step": 1, "metric": "m" * 513}, "metric", "longer than 512"),
        ({"first_step": 0, "last_step": 1, "loss": ["x"]}, "loss[0]", "expected a number"),
    ],
)
def test_a_window_beyond_its_limits_is_refused_naming_the_field(
    window: dict[str, object], path: str, words: str
) -> None:
    with pytest.raises(ProtocolError) as err:
        protocol.decode(json.dumps(_body(window)), Heartbeat)
    assert err.value.path == f"containers[0].window.{path}"
    assert words in str(err.value)


def test_a_1_2_agent_without_windows_is_served_and_a_status_carries_the_progress() -> None:
    old = json.loads(protocol.encode(_heartbeat(None)))
    old["version"] = "1.2"
    del old["containers"][0]["window"]
    assert protocol.decode(json.dumps(old), Heartbeat).containers[0].window is None
    status = Status(
        now=1.0,
        mode="default",
        policy_generation=1,
        containers=(
            ContainerStatus(
                id=ContainerId("job"),
                worker=WorkerId("w0"),
                category=Category.PROGRESSING,
                window=LossWindow(first_step=0, last_step=5, loss=(1.0, 0.5)),
                total_steps=100,
                eta=30.0,
            ),
        ),
    )
    assert protocol.decode(protocol.encode(status), Status) == status
