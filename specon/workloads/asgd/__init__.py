"""Asynchronous SGD with a parameter server as real processes over TCP (MB-ASGD, issue 25).

The real system the throughput model of ``specon.sim.asgd.mva`` is checked against: a
parameter server and workers exchanging float32 tensors, each process on a network host of
its own, the PS's link rate-limited with ``tc``. numpy only (no torch).

- ``wire``: the framing (a 32-byte header, raw float32 payloads, deadlines on every frame);
- ``mlp``: the model and its synthetic data, a ReLU perceptron's forward and backward passes;
- ``server``: the parameter server (FCFS updates, asynchronous, per-update timing records);
- ``worker``: a worker (pull, compute, push; per-mini-batch timing records);
- ``profile``: timing records to the four service times and the PS's throughput (pure);
- ``link``: the ``tc`` rate limits on the PS host's link, both directions;
- ``measure``: one job on network hosts, a one-worker profile, then 2..w workers measured
  against the MVA's predictions (``bench/bench_asgd_model.py``).

``python -m specon.workloads.asgd ps|worker|profile --help``.
"""
