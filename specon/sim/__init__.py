"""The discrete-event simulator: the same Algorithm 1-3 code on a virtual clock.

It drives the manager's own coordinator (``specon.coordinator.inline``) and the policies of
``specon.policy``; it copies neither.

- ``engine``: the virtual clock and its queue of timed callbacks;
- ``cluster``: the simulated runtime (workers, training jobs, migrations, CPU contention);
  ``params``: its measured parameters; ``gpu``: GPU sharing (time-slicing, freezing, MPS,
  suspend and restore); ``gpu_placement``: GPU workers and jobs as the manager sees them;
- ``runner``: one simulated run of a workload under a policy; ``reports``: what its agents report;
  ``quality``: what they know toward each job's quality-point estimate;
- ``failures``: hosts that fail, jobs' checkpoints and the work lost; ``hosts``: failures played out
  in a run (the manager's recovery, or DS's restarts from scratch);
- ``policies``: the policies compared and the lower bound; ``experiment``: runs over seeds;
- ``scenarios``: arrival processes and the paper's A1-A5; ``scenario_file``: a user's own cluster
  (``scenario_gpu``: its GPU keys; ``scenario_failures``: its ``failures:``);
- ``trace``: loss-curve traces; ``curves``: synthetic ones; ``record``: recording real ones;
- ``calibration``: the simulator against the local runtime; ``detection``: the detection benchmark;
  ``oracle``: detection by the ground truth (``specon-oracle``);
- ``report``, ``summary``: tables beside the paper's numbers, JSON and PNGs; ``plane``: each
  policy's average JCT and time-to-quality against DS, the default's knob swept, and which
  peers beat the default on both;
- ``asgd``: MB-ASGD's distributed async-SGD jobs (the MVA throughput model, KNEE/HELL node
  allocation, its 100-node scheduling simulation), apart from the cluster above;
- ``dl2``: ``specon learn``, training the learned priority rule on simulated runs.
"""
