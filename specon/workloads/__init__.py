"""Real PyTorch training workloads: SpeCon's five models (Table II) on synthetic data.

``python -m specon.workloads --model vae --steps 2000`` runs one job under the job contract
(``specon.jobkit``: progress log, checkpoint on SIGTERM, resume). This package imports torch;
``specon`` itself does not, so import the submodules only where torch is installed.

- ``models``: the five model families as small PyTorch modules;
- ``data``: their synthetic data sets, generated from a seed;
- ``registry``: each model with its data, defaults and one training step (``build()``);
- ``runner``: one workload run as a migratable job (``__main__``);
- ``speed``: seconds per training step of each model on this machine (``specon demo``'s fit);
- ``asgd/``: a real asynchronous-SGD job (a parameter server and workers over TCP, numpy only,
  no torch), whose one-worker profile the MVA model of ``specon.sim.asgd`` is checked against.
"""
