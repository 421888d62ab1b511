"""The manager's logic as a sans-I/O state machine, shared by the manager and the simulator.

Events go in (heartbeat, request, result, tick, goodbye; each with the time passed in), effects
come out (journal writes, commands for agents, metric and log events); the shell performs them.

- ``machine``: the ``Coordinator`` itself (Algorithms 2 and 3 applied to the cluster state);
- ``deciding``: its answers to a decision pass (Algorithm 2's requests, Algorithm 3's moves);
- ``command_results``: what each command result an agent sends does to its migration;
- ``reconcile``: which jobs run nowhere and where each is restored (lost hosts, crashes),
  and which jobs a drain moves off;
- ``draining``: cordoning and uncordoning workers (``specon drain``);
- ``remembering``: finished jobs' quality points in, each model's median out to the agents;
- ``evacuation``: reclaim-notice and cordon taints as drains (pure rules);
- ``state``: the manager's picture of the cluster, built from heartbeats;
- ``migration``: a save/restore migration as a pure, journaled state machine (SPEC §6);
- ``deadlines``: how long each migration step may take, and when it stops holding the budget;
- ``effects``: what the coordinator hands its shell, and what the shell hands it at start;
- ``outbox``: commands for agents, kept until a result says they ran;
- ``retention``: forgetting workers and containers unseen for a while;
- ``inline``: a synchronous shell that performs every effect at once (the simulator's).

The manager's asynchronous shell is ``specon_manager.shell``. Nothing here does I/O or reads
a clock (import contract ``pure-core`` in pyproject.toml).
"""
