"""The agent <-> manager wire protocol (SPEC §7), defined once.

- ``protocol``: every message as a frozen dataclass, with its limits declared on its fields;
- ``status``: the status API's messages, and the phase and loss window a heartbeat shares with them;
- ``gpu``: the messages' GPU parts (a worker's devices, a container's use), apart so that the
  runtimes' NVML reader builds them too;
- ``limits``: what a field may declare beyond its type (a length, a range, the id rule), and
  the named bounds;
- ``codec``: plain data (JSON, YAML) <-> frozen dataclasses, driven by the type hints;
- ``fastpath``: msgspec's decode of a well-formed message, the codec's path for anything else;
- ``checks``: the declared limits enforced on every decoded message, compiled per class;
- ``validate``: the one rule for ids that cross a boundary, Kubernetes name rules, and number
  ranges;
- ``operator``: the operator's messages (drain, uncordon), plain JSON outside the envelope;
- ``pod_writes``: a Kubernetes agent's requests for writes on its node's pods, and the
  manager's replies, plain JSON outside the envelope.

The manager's OpenAPI document (``specon_manager.openapi``) is derived from these.
"""
