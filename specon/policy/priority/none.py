"""``none``: no priority on the node (the paper's, and DS's): every job keeps the runtime's
default CPU share, so the worker's CPU is shared equally among its jobs."""

from __future__ import annotations

from specon.policy.plugin import Rule

RULE: Rule[None] = Rule(name="none", summary="equal weights", weights=None, rank=0)
