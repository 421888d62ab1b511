"""``python -m specon.workloads.asgd ps|worker|profile``: a parameter server, a worker, or the
service times of a one-worker run's logs (see ``specon.workloads.asgd``)."""

from __future__ import annotations

import os

# One BLAS thread per process, fixed before numpy loads: the PS and up to four workers share
# the machine's cores, and a BLAS pool per process would fight over them.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402 - after the environment is set
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


def _shape_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (the same on the PS and every worker)")
    g.add_argument("--inputs", type=int, default=256, help="input features (default 256)")
    g.add_argument("--hidden", type=int, default=512, help="units per hidden layer (default 512)")
    g.add_argument("--layers", type=int, default=2, help="hidden layers (default 2)")
    g.add_argument("--outputs", type=int, default=10, help="classes (default 10)")
    g.add_argument("--seed", type=int, default=0, help="initial parameters and data (default 0)")
    g.add_argument("--timeout", type=float, default=30.0, help="seconds one frame may take (default 30)")
    g.add_argument(
        "--congestion",
        metavar="NAME",
        help="TCP congestion control of the connections, e.g. cubic (default: the system's)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specon.workloads.asgd",
        description="Asynchronous SGD with a parameter server over TCP: real processes, real tensors.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ps = sub.add_parser(
        "ps",
        help="run the parameter server",
        description="Run the parameter server: "
        "apply workers' gradients one at a time until --duration ends, then tell them BYE.",
    )
    ps.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ps.add_argument("--port", type=int, default=7810, help="port (default 7810)")
    ps.add_argument("--duration", type=float, default=10.0, help="seconds of training from the first hello")
    ps.add_argument(
        "--wait-workers",
        type=int,
        default=1,
        help="start the --duration clock once this many workers joined (default 1)",
    )
    ps.add_argument("--max-updates", type=int, default=0, help="stop after this many updates (0: no limit)")
    ps.add_argument("--lr", type=float, default=0.005, help="learning rate (default 0.005)")
    ps.add_argument(
        "--optimizer", choices=("sgd", "momentum", "adam"), default="momentum", help="default momentum"
    )
    ps.add_argument(
        "--log", type=Path, required=True, help="JSON lines: one per update, a summary at the end"
    )
    _shape_args(ps)
    wk = sub.add_parser(
        "worker",
        help="run one worker",
        description="Run one worker: pull the parameters, "
        "compute a mini-batch's gradient, push it, until the PS says BYE.",
    )
    wk.add_argument("--ps", required=True, metavar="HOST:PORT", help="the parameter server")
    wk.add_argument("--id", type=int, required=True, help="this worker's number (0, 1, ...)")
    wk.add_argument(
        "--batch", type=int, default=32, help="mini-batch size: the compute per step (default 32)"
    )
    wk.add_argument("--log", type=Path, required=True, help="JSON lines: one per mini-batch")
    wk.add_argument(
        "--connect-timeout", type=float, default=20.0, help="seconds to wait for the PS (default 20)"
    )
    _shape_args(wk)
    pr = sub.add_parser(
        "profile",
        help="service times of a one-worker run",
        description="The four mean service times of a one-worker run's logs, and the "
        "throughput the MVA predicts for 1..--max-workers workers.",
    )
    pr.add_argument("--ps-log", type=Path, required=True, help="the PS's --log")
    pr.add_argument("--worker-log", type=Path, required=True, help="the worker's --log")
    pr.add_argument("--skip", type=int, default=3, help="first mini-batches left out (default 3)")
    pr.add_argument("--max-workers", type=int, default=4, help="predict up to this many workers (default 4)")
    return parser


def _read(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(args: argparse.Namespace) -> int:
    from specon.daemon.logs import configure  # noqa: PLC0415
    from specon.workloads.asgd.mlp import Shape  # noqa: PLC0415

    configure()
    if args.command == "profile":
        from specon.sim.asgd.mva import curve  # noqa: PLC0415
        from specon.workloads.asgd.profile import service_times  # noqa: PLC0415

        prof = service_times(_read(args.ps_log), _read(args.worker_log), skip=args.skip)
        out = {
            "service_times": prof.as_dict(),
            "predicted": {m: curve(prof.times, args.max_workers, m) for m in ("exact", "approx", "hybrid")},
        }
        print(json.dumps(out, indent=2))
        return 0
    shape = Shape(args.inputs, args.hidden, args.layers, args.outputs)
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")
    if args.command == "ps":
        from specon.workloads.asgd.server import ParameterServer, ServerConfig  # noqa: PLC0415

        if args.duration <= 0 or args.lr <= 0 or args.wait_workers < 1:
            raise ValueError("--duration and --lr must be positive, --wait-workers at least 1")
        cfg = ServerConfig(
            args.host,
            args.port,
            shape,
            args.duration,
            args.log,
            lr=args.lr,
            optimizer=args.optimizer,
            seed=args.seed,
            timeout=args.timeout,
            max_updates=args.max_updates,
            wait_workers=args.wait_workers,
            congestion=args.congestion,
        )
        summary = ParameterServer(cfg).serve()
        return 0 if summary["updates"] and not summary["errors"] else 1
    from specon.workloads.asgd.worker import WorkerConfig, run  # noqa: PLC0415

    host, sep, port = args.ps.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--ps must be HOST:PORT, got {args.ps!r}")
    run(
        WorkerConfig(
            host,
            int(port),
            args.id,
            shape,
            args.batch,
            args.log,
            seed=args.seed,
            timeout=args.timeout,
            connect_timeout=args.connect_timeout,
            congestion=args.congestion,
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from specon.workloads.asgd.profile import ProfileError  # noqa: PLC0415
    from specon.workloads.asgd.wire import WireError  # noqa: PLC0415

    try:
        return _run(args)
    except (ValueError, ProfileError, OSError) as exc:
        print(f"asgd {args.command}: {exc}", file=sys.stderr)
        return 2
    except WireError as exc:
        print(f"asgd {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
