"""The status page's workers: per worker its reachability, its load (R(w,t)) as a bar against
its CPUs, its GPUs (memory in use and utilisation), and its jobs, each a chip in its
category's colour linking to the job's card.

Pure: a ``Status`` in, HTML out, every text from outside escaped.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

from specon.wire.gpu import GpuDevice
from specon.wire.status import ContainerStatus, Status, WorkerStatus
from specon_manager.page_jobs import COLOURS, anchor

CSS = """
.load{display:inline-block;vertical-align:middle;height:.6rem;width:7rem;background:#eee;border-radius:.2rem;overflow:hidden}
.load span{display:block;height:100%}
.chips{display:flex;flex-wrap:wrap;gap:.2rem;max-width:48rem}
.chip{padding:0 .35rem;border-radius:.5rem;color:#fff;font-size:.75rem;text-decoration:none}
.chip.off{background:#bbb} .nowrap{white-space:nowrap}
"""
# Load from which the bar turns amber, then red.
BUSY, FULL = 0.7, 0.95
# GPUs listed per worker (the rest are counted).
GPUS_SHOWN = 8
GIB = 2**30


def _load(usage: float) -> str:
    colour = "#c62828" if usage >= FULL else "#f9a825" if usage >= BUSY else "#2e7d32"
    pct = 100 * min(max(usage, 0.0), 1.0)
    return (
        f'<span class="load" title="R(w,t) {pct:.0f}%"><span style="width:{pct:.1f}%;background:{colour}">'
        f"</span></span> {pct:.0f}%"
    )


def _chips(w: WorkerStatus, shown: Mapping[str, ContainerStatus]) -> str:
    """Its jobs: those on this page link to their cards; the others are grey (another page)."""
    out = []
    for cid in w.containers:
        c = shown.get(cid)
        if c is None:
            out.append(f'<span class="chip off" title="on another page">{escape(cid)}</span>')
        else:
            out.append(
                f'<a class="chip" href="#{anchor(cid)}" title="{escape(c.category.value)}" '
                f'style="background:{COLOURS[c.category]}">{escape(cid)}</a>'
            )
    return f'<div class="chips">{"".join(out)}</div>' if out else '<span class="muted">none</span>'


def gib(n: int) -> str:
    """Bytes as GiB, one decimal under 10."""
    x = n / GIB
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def _gpu(d: GpuDevice) -> str:
    util = "" if d.utilisation is None else f" · {d.utilisation:.0f} %"
    return (
        f'<div class="nowrap" title="{escape(d.uuid)}">{d.index}: {escape(d.name)} · '
        f"{gib(d.memory_used)} / {gib(d.memory_total)} GiB{util}</div>"
    )


def _gpus(w: WorkerStatus) -> str:
    if not w.gpus:
        return '<span class="muted">-</span>'
    more = len(w.gpus) - GPUS_SHOWN
    return "".join(map(_gpu, w.gpus[:GPUS_SHOWN])) + (
        f'<div class="muted">+{more} more</div>' if more > 0 else ""
    )


def _row(w: WorkerStatus, shown: Mapping[str, ContainerStatus]) -> str:
    age = "" if w.heartbeat_age is None else f"{w.heartbeat_age:.1f}s ago"
    state = "yes" if w.reachable else "<b>no</b>"
    if not w.ready:
        state += " (said goodbye)"
    return (
        f"<tr><td>{escape(w.id)}</td><td>{escape(w.address)}</td><td>{state}</td>"
        f"<td class=num>{age}</td><td class=num>{w.capacity.cpu:g}</td><td class=nowrap>{_load(w.usage)}</td>"
        f"<td>{_gpus(w)}</td><td class=num>{len(w.containers)}</td><td>{_chips(w, shown)}</td></tr>"
    )


def render_workers(s: Status) -> str:
    """The workers section: one row per worker on this page."""
    shown: dict[str, ContainerStatus] = {c.id: c for c in s.containers}
    rows = "".join(_row(w, shown) for w in s.workers)
    return (
        f"<h2>Workers ({len(s.workers)} of {s.total_workers})</h2>"
        "<table><tr><th>worker</th><th>agent</th><th>reachable</th><th>heartbeat</th><th>CPUs</th>"
        "<th>load</th><th>GPUs (GiB used, utilisation)</th><th>jobs</th>"
        f"<th>its jobs (colour: category)</th></tr>{rows}</table>"
    )
