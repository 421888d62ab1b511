"""What tests and benchmarks use to build inputs and stand in for real backends.

- ``builders``: concise builders for snapshots and simulated workloads;
- ``fake_runtime``: an in-memory runtime backend;
- ``fake_nvml``: NVML (the ``pynvml`` functions) replaced in-process, for tests without a GPU;
- ``certs``: a throwaway certificate authority and the server certificates it signs (TLS tests);
- ``net_hosts``: separate network hosts on one machine (a namespace each on a test bridge);
- ``host_kill``: such a host dying: everything in it and below it SIGKILLed at once (its agent,
  its jobs, a Docker engine and its containers); jobs made runnable in the host-Python image;
- ``held_jobs``: jobs whose end the test controls (the test job's ``--until-released`` file);
- ``progress_log``: a job's progress log as read while the job writes it (whole lines only).

Nothing outside tests and benchmarks may import this package (import contract
``no-testing`` in pyproject.toml), as with ``kopf.testing``.
"""
