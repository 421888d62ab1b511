"""A checkpoint payload made of a framework's own checkpoint files, and the RNG states.

Each framework writes its checkpoint its own way: a file (Lightning's ``.ckpt``, Keras's
``.keras``) or a directory (the Trainer's ``checkpoint-N/``). The payload ``specon.checkpoint``
stores is an uncompressed tar of those files plus ``specon.json``
(``{"format", "framework", "step", ...}``), so one manifest and one checksum cover them all
and a job resumed by the wrong framework is told so. Uncompressed: a checkpoint is mostly
float tensors, and the time a save takes counts against the grace period.

The RNG states (Python, NumPy and torch when imported, and torch's CUDA generators when
initialised) are plain JSON here, so they fit any framework's checkpoint.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specon import jobkit
from specon.integrations.session import newest

# Extracted checkpoints stay until the interpreter exits (the framework reads them when its
# training starts, which may be well after ``extract_newest`` returned).
_EXTRACTED: list[tempfile.TemporaryDirectory[str]] = []

FORMAT = 1
META = "specon.json"


class PayloadError(ValueError):
    """A checkpoint payload that is not one of these integrations' (or not this framework's)."""


def pack(framework: str, step: int, members: Mapping[str, Path], **meta: Any) -> bytes:
    """A tar of ``members`` (name in the archive -> file or directory on disk) and
    ``specon.json`` carrying ``framework``, ``step`` and ``meta`` (JSON values)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        header = json.dumps({"format": FORMAT, "framework": framework, "step": step, **meta}).encode()
        info = tarfile.TarInfo(META)
        info.size = len(header)
        tar.addfile(info, io.BytesIO(header))
        for name, path in members.items():
            tar.add(str(path), arcname=name, recursive=True)
    return buf.getvalue()


def unpack(payload: bytes, dest: Path, framework: str) -> dict[str, Any]:
    """Extract ``payload`` into ``dest``; its ``specon.json``. ``PayloadError`` when it is
    not an archive of ``framework``'s. Extraction uses tarfile's ``data`` filter: nothing
    is written outside ``dest`` and no device or link leaves it."""
    not_ours = PayloadError(f"not a specon.integrations checkpoint (no {META} of format {FORMAT})")
    try:
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:") as tar:
            try:
                member = tar.extractfile(META)
            except KeyError:
                raise not_ours from None
            meta = json.loads(member.read()) if member is not None else None
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise not_ours
            if meta.get("framework") != framework:
                written = meta.get("framework")
                raise PayloadError(f"the checkpoint is the {written!r} integration's, not {framework!r}'s")
            dest.mkdir(parents=True, exist_ok=True)
            tar.extractall(dest, filter="data")
    except PayloadError:
        raise
    except (tarfile.TarError, ValueError) as exc:  # ValueError: JSON; TarError: the data filter's refusals
        raise PayloadError(f"unreadable checkpoint payload: {exc}") from exc
    return meta


def extract_newest(framework: str, directory: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint (``session.newest``) extracted into a temporary
    directory (removed at exit; ``$TMPDIR`` picks where): that directory and its
    ``specon.json``; None when there is none."""
    found = newest(directory)
    if found is None:
        return None
    step, payload = found
    tmp = tempfile.TemporaryDirectory(prefix=f"specon-{framework}-{step}-")
    _EXTRACTED.append(tmp)
    return Path(tmp.name), unpack(payload, Path(tmp.name), framework)


def rng_state() -> dict[str, Any]:
    """``jobkit.rng_state()`` as JSON values, plus the CUDA generators once CUDA is in use."""
    state = jobkit.rng_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = state["torch"].tolist()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what ``rng_state`` captured (parts for modules not imported are left alone)."""
    restored = dict(state)
    torch = sys.modules.get("torch")
    if torch is not None:
        if "torch" in restored:
            restored["torch"] = torch.tensor(restored["torch"], dtype=torch.uint8)
        if "cuda" in restored and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in restored["cuda"]])
    else:
        restored.pop("torch", None)
    restored.pop("cuda", None)
    jobkit.set_rng_state(restored)
