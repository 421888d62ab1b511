"""Real PyTorch training workloads: SpeCon's five models (Table II) on synthetic data.

``python -m specon.workloads --model vae --steps 2000`` runs one job under the job contract
(``specon.jobkit``: progress log, checkpoint on SIGTERM, resume). ``specon.workloads.registry``
holds the models' defaults and ``build()`` for in-process use. This package imports torch;
``specon`` itself does not, so import the submodules only where torch is installed.
"""
