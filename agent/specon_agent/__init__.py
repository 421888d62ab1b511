"""The specon node agent: one per worker; tails job logs, classifies, heartbeats, executes commands.

An I/O shell around ``specon``'s pure core: no algorithm and no message schema lives here.

- ``__main__``: ``specon-agent``, its arguments and start-up;
- ``core``: the agent's work without the network (watch containers, classify, heartbeat);
  ``commands``: the manager's commands, run once per id (save, start, mark, stop);
- ``resumed``: when a restarted job trains again (its first record after the start);
- ``watched``: what it keeps per container; ``window``: each job's loss window for the status page;
- ``priority``: the priority action's pure half; ``weights``: its I/O shell;
- ``gpus``: the worker's GPU usage (NVML); ``gpu_metrics``: its /metrics; ``gpu_share``: the
  priority on a GPU (freeze, suspend, resume), the I/O shell of ``specon.policy.gpu_share``;
- ``reports``: the heartbeat's per-container reports; ``labels``: the job labels they carry;
  ``taints_file``: taints the host announces;
- ``client``: the HTTP client for the manager; ``daemon``: the supervised background tasks;
- ``k8s_pod_writes``: a Kubernetes agent's pod writes, asked of the manager (retried while it
  restarts);
- ``app``: the agent's own /healthz and /metrics.
"""
