"""ResumableLoader: a saved position resumes the same epoch at the same batch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import TensorDataset  # noqa: E402  (after the torch check)

from specon.integrations.loader import ResumableLoader  # noqa: E402


def loader(shuffle: bool = True) -> ResumableLoader:
    return ResumableLoader(TensorDataset(torch.arange(20)), batch_size=4, shuffle=shuffle)


def values(batches: list[list[torch.Tensor]]) -> list[list[int]]:
    return [b[0].tolist() for b in batches]


def test_a_resumed_epoch_goes_on_where_the_saved_one_stopped() -> None:
    torch.manual_seed(0)
    first = loader()
    it = iter(first)
    seen = [next(it) for _ in range(2)]
    state = first.state_dict()
    rest = list(it)
    assert state["position"] == 2

    resumed = loader()
    resumed.load_state_dict(state)
    again = list(resumed)
    assert values(again) == values(rest)
    assert sorted(v for batch in values(seen + again) for v in batch) == list(range(20))  # each once


def test_a_batch_in_hand_is_not_counted_as_trained() -> None:
    first = loader(shuffle=False)
    it = iter(first)
    next(it), next(it), next(it)
    first.in_hand = 1
    assert first.state_dict()["position"] == 2
    resumed = loader(shuffle=False)
    resumed.load_state_dict(first.state_dict())
    assert values(list(resumed))[0] == [8, 9, 10, 11]  # the third batch, handed out but not trained


def test_each_epoch_draws_a_new_order_and_a_finished_one_resumes_empty() -> None:
    torch.manual_seed(1)
    dl = loader()
    one, two = values(list(dl)), values(list(dl))
    assert one != two
    state = dl.state_dict()
    assert state["position"] == 5
    resumed = loader()
    resumed.load_state_dict(state)
    assert list(resumed) == []
    assert len(values(list(resumed))) == 5  # the next epoch is whole again
