"""Framework integrations: a callback per framework that makes its training loop a
migratable job (the job contract, SPEC §6) without touching the loop. docs/integrations.md.

Each framework module imports its framework and nothing else does (the import contracts);
import the one you use, e.g. ``from specon.integrations import lightning``:

- ``lightning``: a Lightning ``Callback`` and ``fit`` (the ``lightning`` extra);
- ``transformers``: a Hugging Face ``TrainerCallback`` and ``train`` (the ``transformers`` extra);
- ``keras``: a Keras 3 ``Callback`` and ``fit`` (the ``keras`` extra);
- ``loader``: ``ResumableLoader``, the torch ``DataLoader`` a Lightning job resumes mid-epoch;
- ``session``: the contract for a loop a framework drives (progress records, signals,
  checkpoints, the done marker), framework-free;
- ``archive``: the checkpoint payload (a framework's own checkpoint files, packed) and the
  RNG states as JSON.
"""
