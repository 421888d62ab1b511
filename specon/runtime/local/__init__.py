"""The local backend: jobs as process groups on this machine, in per-worker CPU budgets.

- ``backend``: ``LocalRuntime``, one worker's runtime (its owner records:
  ``specon.runtime.owners``);
- ``cluster``: ``LocalCluster``, several workers on one machine sharing one volume;
- ``launcher``: the tiny supervisor every local job runs under; ``cold``: starting it in a
  fresh interpreter, which joins the worker's budget itself;
- ``warm``, ``zygote``: the warm interpreter that starts restored jobs without a cold import;
- ``standby``, ``standby_pool``: a primed interpreter per GPU that becomes a restored GPU job;
- ``cgroups``, ``cpuset``, ``cgroup_entry``: CPU budgets, pinning, and where a process goes;
  ``cgroup_v1``, ``cgroup_v2``, ``cgroup_files``: the two cgroup versions' groups and files;
- ``freezer``: freezing a job where it stands (cgroup freezer, else SIGSTOP);
- ``procfs``: what the runtime reads from ``/proc``.
"""
