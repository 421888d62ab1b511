"""The PyTorch helpers of the job contract: payload round trip with optimizer and RNG state."""

from __future__ import annotations

import io
import random

import pytest

from specon import jobkit

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")


def _model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 4)
        noise = random.random() + float(np.random.rand())
        loss = (model(x) ** 2).mean() + noise
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
def test_resumed_training_continues_exactly_as_uninterrupted() -> None:
    random.seed(1)
    np.random.seed(1)
    model, opt = _model_and_optimizer(0)
    _train(model, opt, 5)
    payload = jobkit.torch_payload(
        model, opt, {"epoch": 3, "gen": torch.Generator().manual_seed(9).get_state()}
    )
    expected = _train(model, opt, 5)

    random.seed(99)  # a new process: different RNGs and weights until restored
    np.random.seed(99)
    fresh, fresh_opt = _model_and_optimizer(42)
    extra = jobkit.torch_restore(payload, fresh, fresh_opt)
    assert extra["epoch"] == 3
    assert torch.equal(extra["gen"], torch.Generator().manual_seed(9).get_state())
    assert _train(fresh, fresh_opt, 5) == expected


@pytest.mark.slow
def test_payload_without_optimizer() -> None:
    model, _ = _model_and_optimizer(0)
    fresh, _ = _model_and_optimizer(1)
    assert jobkit.torch_restore(jobkit.torch_payload(model), fresh) is None
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True)
    )


def test_foreign_payload_is_rejected() -> None:
    buf = io.BytesIO()
    torch.save({"weights": torch.zeros(2)}, buf)
    model, opt = _model_and_optimizer(0)
    with pytest.raises(ValueError, match=r"not a specon\.jobkit torch payload"):
        jobkit.torch_restore(buf.getvalue(), model, opt)
