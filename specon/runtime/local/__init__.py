"""The local backend: jobs as process groups on this machine, in per-worker CPU budgets.

- ``backend``: ``LocalRuntime``, one worker's runtime (its owner records:
  ``specon.runtime.owners``);
- ``cluster``: ``LocalCluster``, several workers on one machine sharing one volume;
- ``launcher``: the tiny supervisor every local job runs under;
- ``warm``, ``zygote``: the warm interpreter that starts restored jobs without a cold import;
- ``cgroups``, ``cpuset``, ``cgroup_entry``: CPU budgets, pinning, and where a process goes.
"""
