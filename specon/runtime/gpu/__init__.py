"""A worker's GPUs, for the agent: what NVML reads and what it means for the containers.

- ``nvml``: the reader over ``pynvml`` (the ``specon[gpu]`` extra), imported at the first read;
  no package, no driver or no GPU: unavailable, said once, and the agent runs as without GPUs;
- ``sample``: pure: a reading mapped onto containers by their host PIDs (``Runtime.pids``),
  and the worker's GPU labels and capacity.

The fake NVML for tests is ``specon.testing.fake_nvml``.
"""
