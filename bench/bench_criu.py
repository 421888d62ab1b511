"""Migration downtime with CRIU against the job contract, between two real Docker engines.

Two private ``dockerd`` (experimental, ``criu`` 4.1 from ``scripts/install-criu.sh`` first on
their PATH; ``tests/docker/engines.py``) play two hosts sharing one volume. Each job
(``bench/_criu_job.py``: ``small``, a Python loop logging every 0.05 s; ``torch``, a
single-process one-thread PyTorch MLP) runs on one engine and is moved back and forth
``RUNS`` times per mode, the target container created before each move as the backend does:

* ``criu``: ``docker_criu.checkpoint`` (``Exit`` true) on the source, ``docker_criu.restore``
  on the target; the process continues where it was frozen;
* ``contract``: ``stop`` (SIGTERM; the job checkpoints and exits 75), then ``start`` on the
  target, which resumes from that checkpoint (interpreter, imports, model, checkpoint load).

Downtime = from the move's start (checkpoint call / SIGTERM) to the job's first training
record written after it on the target (the record's own timestamp). Per job and mode: median
and min-max of the downtime, medians of the two halves (checkpoint or stop; restore or start
to that record) and the CRIU image size. Targets (issue 12): CRIU median < 1 s for the small
job, < 3 s for the torch job. The samples go to ``results/criu_samples.json``. Where CRIU
cannot work here (``install-criu.sh`` exits 3) or no engine runs, it reports nothing.
Env: ``SPECON_BENCH_CRIU_KINDS`` (default ``small,torch``), ``SPECON_BENCH_CRIU_DIR`` (where the
engines and the volume live, default /tmp; /dev/shm measured the same: the cost is CPU).

Where CRIU's time goes (measured): Docker 20.10 passes the images through containerd's content
store both ways (containerd tars and digests them, dockerd unpacks them into the checkpoint
directory; on restore the reverse), so for the torch job's 230 MB about 5.5 s of the
checkpoint's CPU is dockerd + containerd, not CRIU; the small job's 9 MB barely notice it.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.figures import Figure
from specon.runtime.docker import criu as docker_criu
from tests.docker.engines import DockerUnavailable, Engine, job_binds, python_image, start_engine, stop_engine

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SAMPLES_FILE = RESULTS / "criu_samples.json"
JOB = REPO / "bench" / "_criu_job.py"
RUNS = {False: 5, True: 2}
KINDS = tuple(os.environ.get("SPECON_BENCH_CRIU_KINDS", "small,torch").split(","))
MODES = ("criu", "contract")
TARGETS = {"small": 1.0, "torch": 3.0}  # s, CRIU median downtime
WARM_RECORDS = 10  # training records before a move (torch imported, steps running)
TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class Move:
    kind: str
    mode: str
    run: int
    downtime: float  # move start -> first training record after it on the target
    save: float  # checkpoint call, or stop (SIGTERM -> exit)
    restore: float  # restore call, or start -> that first record
    image_mb: float  # CRIU images (criu) or the job's checkpoint (contract)


def install_criu() -> Path | str:
    """The wrapper's directory, or why CRIU cannot work here."""
    done = subprocess.run(
        [str(REPO / "scripts" / "install-criu.sh")], capture_output=True, text=True, check=False
    )
    if done.returncode == 3:
        return done.stderr.strip()[-300:]
    if done.returncode != 0:
        raise RuntimeError(f"install-criu.sh exited {done.returncode}: {done.stderr[-1000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _records(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            break
    return out


def _wait(path: Path, pred: Callable[[list[dict[str, Any]]], bool], what: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + TIMEOUT
    while not pred(got := _records(path)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen in {TIMEOUT:.0f} s ({len(got)} records)")
        time.sleep(0.01)
    return got


def _training(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "loss" in r]


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def _measure(
    kind: str, mode: str, engines: tuple[Engine, Engine], *, image: str, work: Path, runs: int
) -> list[Move]:
    volume = work / f"{kind}-{mode}"
    volume.mkdir(parents=True)
    progress, ckpt_dir, criu_dir = volume / "progress.jsonl", volume / "checkpoints", volume / "criu"
    kwargs: dict[str, Any] = {
        "image": image,
        "command": [str(REPO / ".venv" / "bin" / "python"), str(JOB), kind],
        "environment": {
            "SPECON_PROGRESS_FILE": str(progress),
            "SPECON_CHECKPOINT_DIR": str(ckpt_dir),
            "SPECON_JOB_ID": f"{kind}-{mode}",
            "OMP_NUM_THREADS": "1",
        },
        "network_mode": "none",
        "volumes": job_binds(volume),
    }
    clients = [e.client() for e in engines]
    here = clients[0].containers.run(detach=True, **kwargs)
    moves: list[Move] = []
    try:
        for run in range(runs):
            src, dst = clients[run % 2], clients[(run + 1) % 2]
            seen = len(_training(_records(progress)))
            _wait(progress, lambda r, n=seen: len(_training(r)) >= n + WARM_RECORDS, f"{kind} training")
            there = dst.containers.create(**kwargs)
            t0 = time.time()
            if mode == "criu":
                name = f"move-{run}"
                save = docker_criu.checkpoint(src.api, here.id, name, criu_dir)
                frozen = len(_records(progress))
                restore = docker_criu.restore(dst.api, there.id, name, criu_dir)
                size = _size_mb(criu_dir / name)
            else:
                here.stop(timeout=60)
                save = time.time() - t0
                code = here.wait(timeout=10)["StatusCode"]
                if code != 75:  # jobkit.EXIT_CHECKPOINTED
                    raise RuntimeError(f"{kind}: the job exited {code} on SIGTERM, not 75")
                frozen = len(_records(progress))
                there.start()
                restore = 0.0
                size = _size_mb(ckpt_dir)
            after = _wait(
                progress, lambda r, n=frozen: bool(_training(r[n:])), f"{kind} first record after the move"
            )
            first = _training(after[frozen:])[0]
            downtime = first["ts"] - t0
            if mode == "contract":
                restore = downtime - save
            moves.append(Move(kind, mode, run, downtime, save, restore, size))
            print(
                f"  ... {kind:5} {mode:8} run {run}: downtime {downtime:.2f} s"
                f" (save {save:.2f} s, restore {restore:.2f} s, {size:.1f} MB)",
                flush=True,
            )
            here.remove(force=True)
            here = there
    finally:
        here.remove(force=True)
    return moves


def _spread(values: list[float]) -> str:
    return f"min {min(values):.2f}, max {max(values):.2f}, n={len(values)}"


def run(quick: bool) -> list[Figure]:
    criu_bin = install_criu()
    if isinstance(criu_bin, str):
        print(f"  skipped: CRIU cannot work here: {criu_bin}", flush=True)
        return []
    # Short: socket paths <= 108 bytes. SPECON_BENCH_CRIU_DIR: where the engines' roots and the
    # volume live (e.g. /dev/shm, to see what the disk costs).
    base = Path(tempfile.mkdtemp(prefix="sbc-", dir=os.environ.get("SPECON_BENCH_CRIU_DIR", "/tmp")))
    started: list[Engine] = []
    moves: list[Move] = []
    try:
        try:
            for name in ("1", "2"):
                started.append(
                    start_engine(
                        f"criu-{name}",
                        base / name,
                        experimental=True,
                        criu_bin=criu_bin,
                        init_path=criu_bin / "tini-static",
                    )
                )
        except DockerUnavailable as err:
            print(f"  skipped: no Docker engine here: {err}", flush=True)
            return []
        image = {python_image(e) for e in started}.pop()
        engines = (started[0], started[1])
        for kind in KINDS:
            for mode in MODES:
                moves += _measure(kind, mode, engines, image=image, work=base / "work", runs=RUNS[quick])
    finally:
        for e in started:
            stop_engine(e)
        shutil.rmtree(base, ignore_errors=True)

    figures: list[Figure] = []
    table = [
        "| job | mode | downtime median (s) | min-max (s) | save median (s) | restore median (s) | MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        for mode in MODES:
            ms = [m for m in moves if m.kind == kind and m.mode == mode]
            down = [m.downtime for m in ms]
            med = statistics.median(down)
            save, restore = statistics.median(m.save for m in ms), statistics.median(m.restore for m in ms)
            size = statistics.median(m.image_mb for m in ms)
            label = "CRIU" if mode == "criu" else "job contract"
            figures.append(
                Figure(
                    f"{label} downtime median, {kind} job",
                    med,
                    "s",
                    TARGETS[kind] if mode == "criu" else None,
                    "max",
                    f"{_spread(down)}; save {save:.2f} s, restore {restore:.2f} s, {size:.1f} MB",
                )
            )
            spread = f"{min(down):.2f}-{max(down):.2f}"
            table.append(
                f"| {kind} | {label} | {med:.2f} | {spread} | {save:.2f} | {restore:.2f} | {size:.1f} |"
            )
    print("\n".join(table), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    SAMPLES_FILE.write_text(
        json.dumps(
            {
                "quick": quick,
                "python": sys.version.split()[0],
                "cpus": os.cpu_count(),
                "moves": [asdict(m) for m in moves],
                "table": table,
            },
            indent=2,
        )
        + "\n"
    )
    return figures
