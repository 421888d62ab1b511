"""MB-ASGD: throughput of asynchronous-SGD jobs and node allocation across them.

- ``mva``: the closed queueing network of one job (Section III) solved by exact, approximate
  and hybrid MVA, and the speedup and efficiency the policies read;
- ``dnn``: the workload of the paper's evaluation (Table III on K520 GPUs and 1 Gbps links);
- ``allocation``: the scheduling policies (KNEE, HELL, Waterfill, SRPT-type; malleable and
  moldable) as pure functions;
- ``cluster``: the event-driven simulation of a 100-node cluster under those policies;
- ``report``: the benchmark's and the CLI's tables and JSON.
"""
