"""specon: speculative container scheduling for deep-learning training clusters.

The core package; the daemons (``specon_agent``, ``specon_manager``), the simulator and the
CLI are built from it, and it imports neither daemon. Its parts, from the pure core outwards:

- ``model``: the shared vocabulary (ids, categories, the frozen snapshots decisions are made on);
- ``policy/``: Algorithms 1-3 and every other policy, pure (no I/O, no clock);
- ``config/``: the versioned policy file that configures them;
- ``coordinator/``: the manager's logic as a sans-I/O state machine;
- ``wire/``: the agent <-> manager protocol and its codec;
- ``progress/``: reading training progress logs;
- ``runtime/``: the interface the agent drives, and its local, Docker and Kubernetes backends;
- ``daemon/``: what both daemons share (settings, logging, command-line pieces);
- ``sim/``: the simulator, which drives the same coordinator and policies on a virtual clock;
- ``embedded/``: the one-machine cluster and ``specon demo``;
- ``evaluation``: how runs are scored (JCT, makespan), for the demo and the simulator;
- ``jobkit``, ``checkpoint``, ``fence``: the job side, what a training script imports (standard
  library only); ``fence`` stops a stale copy of a job before it writes;
- ``integrations/``: the job side for framework jobs: Lightning, Trainer and Keras callbacks that
  follow the job contract without touching the training loop (their extras);
- ``workloads/``: the built-in PyTorch training workloads;
- ``cli/``: the ``specon`` command; ``plots``: its PNG plots (the plot extra); ``argtypes``:
  the number checks every command line shares;
- ``testing/``: builders and the fake runtime, for tests and benchmarks only.

docs/architecture.md draws the picture; docs/SPEC.md is the behaviour ("SPEC §n" in the code).
"""

__version__ = "0.1.0"
