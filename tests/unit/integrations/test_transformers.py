"""The Trainer callback with the real Hugging Face Trainer (CPU, a tiny GPT-2 built from a
config: nothing downloaded, in this process).

A stop is asked for by a real SIGTERM sent after step ``k``; the Trainer saves its own
checkpoint at that step boundary, the job exits 75, and the resumed job ends with every
step trained once and the same weights as a run that was never stopped.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from specon import jobkit  # noqa: E402  (after the checks)
from specon.integrations import transformers as specon_hf  # noqa: E402
from tests.unit.integrations.conftest import events, records, sample_steps  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 12  # 3 epochs of 4 batches


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 20, (32, 6), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class SigtermAfter(transformers.TrainerCallback):
    def __init__(self, k: int) -> None:
        self.k = k

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.k:
            os.kill(os.getpid(), signal.SIGTERM)


def run(output: Path, *, stop_after: int | None = None, **args: Any) -> dict[str, torch.Tensor]:
    """One start of the job (a fresh model, seeded as a script would); its final weights."""
    transformers.set_seed(5)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=20, n_positions=8)
    model = transformers.GPT2LMHeadModel(config)
    training = transformers.TrainingArguments(
        output_dir=str(output),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        warmup_steps=2,
        save_strategy=args.pop("save_strategy", "no"),
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=5,
        **args,
    )
    # The signal first: it arrives before this step's boundary is checked.
    callbacks: list[Any] = [] if stop_after is None else [SigtermAfter(stop_after)]
    callbacks.append(specon_hf.Migratable(checkpoint_every=None, checkpoint_interval=None))
    trainer = transformers.Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=callbacks)
    specon_hf.train(trainer)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def unmoved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(jobkit.ENV_CHECKPOINT_DIR, raising=False)
        mp.delenv(jobkit.ENV_PROGRESS_FILE, raising=False)
        return run(tmp_path_factory.mktemp("unmoved"))


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("k", [3, 4])  # mid-epoch; an epoch's last step
def test_a_stopped_job_resumes_exactly(job_env: Path, unmoved: dict[str, torch.Tensor], k: int) -> None:
    progress, output = job_env / "progress.jsonl", job_env / "hf-output"
    with pytest.raises(SystemExit) as exit_:
        run(output, stop_after=k)
    assert exit_.value.code == jobkit.EXIT_CHECKPOINTED
    assert events(progress)[-1] == {"event": "checkpointed", "step": k, "ts": events(progress)[-1]["ts"]}
    assert list(output.iterdir()) == []  # the Trainer's folder, once packed, is gone
    final = run(output)
    assert sample_steps(progress) == list(range(1, STEPS + 1))  # a sample per step, none twice
    assert all("learning_rate" in r for r in records(progress) if "loss" in r)
    starts = [e for e in events(progress) if e["event"] == "started"]
    assert [(e["step"], e["steps"]) for e in starts] == [(0, STEPS), (k, STEPS)]
    assert events(progress)[-1]["event"] == "finished" and jobkit.read_done(job_env / "checkpoints")
    assert same(final, unmoved)


def test_the_trainers_own_saves_are_left_alone(job_env: Path) -> None:
    """Where the user's save_steps saves anyway, the folder stays; where only specon asked, it goes."""
    output = job_env / "hf-output"
    migratable = specon_hf.Migratable(checkpoint_every=3, checkpoint_interval=None)
    transformers.set_seed(5)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=20, n_positions=8)
    training = transformers.TrainingArguments(
        output_dir=str(output),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        save_strategy="steps",
        save_steps=6,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    model = transformers.GPT2LMHeadModel(config)
    trainer = transformers.Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=[migratable])
    specon_hf.train(trainer)
    assert sorted(p.name for p in output.iterdir()) == ["checkpoint-12", "checkpoint-6"]
    periodic = [e["step"] for e in events(job_env / "progress.jsonl") if e["event"] == "checkpoint"]
    assert periodic == [3, 6, 9]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back after train
