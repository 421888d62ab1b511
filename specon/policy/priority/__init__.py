"""Priority on the node: CPU weights for the containers that share one worker.

A placement policy decides *where* a job runs; a priority rule decides *how the worker's CPU
is shared* among the jobs already there. Each rule is a module that declares itself
(``RULE``: its name, its arguments with their defaults, help and checks, and its weights)
and orders a worker's jobs from most to least deserving; its weights are per-container CPU
weights in cgroup v2's ``cpu.weight`` range (1..10,000), which every backend applies as it
can (cgroup ``cpu.weight`` / ``cpu.shares``, Docker ``cpu_shares``, a pod's cgroup).

The weights are near-strict by default (``ratio`` 100 between neighbours): the first job
gets all the CPU it can use, the second what is left, and so on, which is how
shortest-remaining-first and least-attained-service are defined. A smaller ratio shares
more evenly.

- ``rules``: the registry (every module here with a ``RULE``) and the weights under a policy;
- ``base``: what a rule sees of a job, and how an order becomes weights;
- the rules: ``none`` (equal shares), ``fsp``, ``phased`` (the default), ``srpt``, ``optimus``,
  ``tiresias``, ``hermes``, ``slaq``.
"""
