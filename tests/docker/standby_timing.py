"""Measure a restore's time cold and through a standby container on a private Docker engine.

    .venv/bin/python -m tests.docker.standby_timing --rounds 3

The GRU workload (primed on the CPU: no GPU here) trains on one engine; each round saves it and
restores it twice, once through a ready standby container and once cold, timing the ``start``
call to its first trained step after the checkpoint. Prints each restore and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from specon.model import ContainerId, WorkerId
from specon.runtime.base import JobSpec, SaveResult
from specon.runtime.docker.backend import DockerRuntime
from tests.docker import test_runtime_docker as rd
from tests.docker.engines import python_image, start_engine, stop_engine
from tests.docker.test_standby_docker import config, gru, loss_steps, spec


async def restore(rt: DockerRuntime, vol: Path, job: str, s: JobSpec, saved: SaveResult) -> float:
    t0 = time.monotonic()
    await rt.start(rt.job_spec(ContainerId(job)) or s, checkpoint=saved.checkpoint)
    while not any(st > (saved.step or 0) for st in loss_steps(vol, job)):
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def main(rounds: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="standby-timing-", dir="/tmp"))
    engine = start_engine("m", base / "e")
    try:
        tag = python_image(engine)
        vol = base / "vol"
        vol.mkdir()
        warm = DockerRuntime(
            vol, WorkerId("host-1"), engine.client(), rules=rd.rules(vol), standby=config(tag)
        )
        cold = DockerRuntime(vol, WorkerId("host-1"), engine.client(), rules=rd.rules(vol))
        assert warm.standbys is not None
        job = "m-1"
        s = spec(job, gru(tag, vol, "--steps", "1000000", "--log-every", "1", "--checkpoint-every", "100000"))
        await cold.start(s)
        await rd.wait_step(vol, job, 20)
        out: dict[str, list[float]] = {"cold": [], "standby": []}
        for _ in range(rounds):
            for kind, rt in (("standby", warm), ("cold", cold)):
                saved = await cold.save(ContainerId(job), grace=30)
                while not all(warm.standbys.ready().values()):
                    await asyncio.sleep(0.2)
                await asyncio.sleep(3)  # the machine settles after priming
                took = await restore(rt, vol, job, s, saved)
                out[kind].append(took)
                print(f"{kind}: {took:.2f} s", flush=True)
                await rd.wait_step(vol, job, (saved.step or 0) + 20)
        for kind, runs in out.items():
            print(f"{kind}: median {statistics.median(runs):.2f} s of {', '.join(f'{r:.2f}' for r in runs)}")
        warm.close()
    finally:
        stop_engine(engine)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args().rounds))
