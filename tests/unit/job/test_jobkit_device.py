"""``--device``: which device a job trains on, checkpoints that load on any device, and a
workload that resumes with exactly its steps. No GPU here: the CUDA cases fake torch's answers
or skip saying they need one."""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from specon import jobkit

torch = pytest.importorskip("torch")

NEEDS_GPU = "needs an NVIDIA GPU: torch.cuda.is_available() is False here"


def test_auto_is_cuda_where_torch_sees_a_gpu_else_the_cpu() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert jobkit.torch_device("auto").type == expected
    assert jobkit.torch_device().type == expected
    assert jobkit.torch_device("cpu") == torch.device("cpu")
    assert jobkit.torch_device("cpu:0") == torch.device("cpu", 0)


def test_cuda_without_cuda_is_an_error_that_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ValueError, match=r"CUDA is not available: this torch \(.*\) is built without CUDA"):
        jobkit.torch_device("cuda")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match=r"no GPU is visible \(CUDA_VISIBLE_DEVICES=''\)"):
        jobkit.torch_device("cuda:0")
    assert jobkit.torch_device("auto").type == "cpu"


def test_a_gpu_index_past_those_visible_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert jobkit.torch_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"only 1 GPU\(s\) visible"):
        jobkit.torch_device("cuda:3")


@pytest.mark.parametrize(("name", "message"), [("tpu", "unknown device"), ("meta", "only auto, cpu, cuda")])
def test_other_devices_are_refused(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        jobkit.torch_device(name)


def _model() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    return model, opt


def _tensors(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


@pytest.mark.slow  # the first optimizer imports torch._dynamo
def test_a_payload_holds_cpu_tensors_only_and_loads_onto_the_models_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, opt = _model()
    payload = jobkit.torch_payload(model, opt, {"gen": torch.Generator().get_state()})
    raw = torch.load(io.BytesIO(payload), weights_only=True)  # no map_location needed
    assert {t.device.type for t in _tensors(raw)} == {"cpu"}
    assert "cuda_rng" not in raw or torch.cuda.is_initialized()

    seen: list[Any] = []
    real_load = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("map_location"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    fresh, fresh_opt = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)), None
    jobkit.torch_restore(payload, fresh, fresh_opt)
    jobkit.torch_restore(payload, fresh, map_location="cpu")
    assert seen == [torch.device("cpu"), "cpu"], "by default, the device of the model's parameters"
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True)
    )


def test_a_model_without_parameters_loads_onto_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = jobkit.torch_payload(torch.nn.ReLU())
    seen: list[Any] = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: seen.append(k["map_location"]) or real_load(*a, **k))
    jobkit.torch_restore(payload, torch.nn.ReLU())
    assert seen == [torch.device("cpu")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NEEDS_GPU)
def test_a_checkpoint_moves_between_the_gpu_and_the_cpu() -> None:
    model, opt = _model()
    on_gpu = model.to("cuda")
    gpu_opt = torch.optim.Adam(on_gpu.parameters(), lr=0.1)
    gpu_opt.load_state_dict(opt.state_dict())
    payload = jobkit.torch_payload(on_gpu, gpu_opt)
    back, back_opt = _model()
    jobkit.torch_restore(payload, back, back_opt)
    assert {p.device.type for p in back.parameters()} == {"cpu"}
    again = _model()[0].to("cuda")
    jobkit.torch_restore(jobkit.torch_payload(back, back_opt), again)
    assert {p.device.type for p in again.parameters()} == {"cuda"}


def _run(tmp_path: Path, device: str, *, stop_at: int | None, monkeypatch: pytest.MonkeyPatch) -> int:
    """One in-process run of ``python -m specon.workloads`` (gru, 24 steps); SIGTERM at ``stop_at``."""
    from specon.workloads import registry, runner  # noqa: PLC0415 - imports torch

    real_step = registry.Workload.train_step
    done = [0]

    def step(self: Any) -> float:
        loss = real_step(self)
        done[0] += 1
        if done[0] == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)  # jobkit's handler: checkpoint at the next boundary
        return loss

    monkeypatch.setattr(registry.Workload, "train_step", step)
    argv = ["--model", "gru", "--steps", "24", "--batch-size", "16", "--log-every", "1", "--device", device]
    argv += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--progress-file", str(tmp_path / "progress.jsonl")]
    try:
        return runner.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_workload_stopped_on_one_device_resumes_on_another_with_exactly_its_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    straight = tmp_path / "straight"
    assert _run(straight, "cpu", stop_at=None, monkeypatch=monkeypatch) == 0
    moved = tmp_path / "moved"
    assert _run(moved, "auto", stop_at=10, monkeypatch=monkeypatch) == jobkit.EXIT_CHECKPOINTED
    assert _run(moved, "cpu", stop_at=None, monkeypatch=monkeypatch) == 0

    recs = _records(moved)
    assert [r["step"] for r in recs if "loss" in r] == list(range(1, 25))
    assert [(r["step"], r["resumed"]) for r in recs if r.get("event") == "started"] == [
        (0, False),
        (10, True),
    ]
    assert recs[-1]["event"] == "finished" and recs[-1]["steps"] == 24
    if not torch.cuda.is_available():  # the same device throughout: the very same training
        losses = {r["step"]: r["loss"] for r in _records(straight) if "loss" in r}
        assert {r["step"]: r["loss"] for r in recs if "loss" in r} == losses
