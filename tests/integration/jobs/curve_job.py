"""A torch-free training job with a scripted loss curve, honouring the job contract via jobkit.

``converge``: loss = 1 / (1 + 0.2·step) (steep, then flat: converges in seconds);
``linear``: loss = 10 - 0.015·step (keeps progressing at a constant rate).
"""

from __future__ import annotations

import argparse
import json
import time

from specon import jobkit

CURVES = {
    "converge": lambda s: 1.0 / (1.0 + 0.2 * s),
    "linear": lambda s: 10.0 - 0.015 * s,
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--curve", choices=sorted(CURVES), default="converge")
    p.add_argument("--step-seconds", type=float, default=0.05)
    args = p.parse_args()
    curve = CURVES[args.curve]
    state = {"trained": 0}
    with jobkit.Job(
        steps=args.steps,
        save=lambda: json.dumps(state).encode(),
        restore=lambda b: state.update(json.loads(b)),
        checkpoint_every=50,
    ) as job:
        for step in job.steps():
            time.sleep(args.step_seconds)
            state["trained"] += 1
            job.log(step, curve(step))


if __name__ == "__main__":
    main()
