"""The agent <-> manager wire protocol (SPEC §7), defined once.

- ``protocol``: every message as a frozen dataclass, with its limits declared on its fields;
- ``codec``: plain data (JSON, YAML) <-> frozen dataclasses, driven by the type hints;
- ``checks``: the range and identity rules no type can express;
- ``validate``: the one rule for ids that cross a boundary, and number ranges.

The manager's OpenAPI document (``specon_manager.openapi``) is derived from these.
"""
