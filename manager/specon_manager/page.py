"""The status page at ``GET /``: the ``Status`` a person reads in a browser, refreshing itself."""

from __future__ import annotations

import datetime as dt
from html import escape
from urllib.parse import quote

from specon.model import Category
from specon.wire.protocol import ContainerStatus, Status

REFRESH_SECONDS = 5
COLOURS = {
    Category.PROGRESSING: "#2e7d32",
    Category.WATCHING: "#f9a825",
    Category.CONVERGED: "#1565c0",
    Category.DIVERGING: "#c62828",
    Category.STALLED: "#757575",
}

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
h1{font-size:1.3rem;margin:0 0 .2rem} h2{font-size:1.05rem;margin:1.4rem 0 .4rem}
table{border-collapse:collapse;font-size:.88rem}
td,th{padding:.25rem .6rem;border-bottom:1px solid #ddd;text-align:left}
th{background:#f4f4f4} .muted{color:#777} .num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:0 .45rem;border-radius:.6rem;color:#fff;font-size:.8rem}
.bar{display:flex;height:.7rem;width:16rem;background:#eee;border-radius:.2rem;overflow:hidden}
.bar span{display:block;height:100%}
"""


def _badge(cat: Category) -> str:
    return f'<span class="badge" style="background:{COLOURS[cat]}">{escape(cat.value)}</span>'


def _time(t: float | None) -> str:
    if t is None:
        return '<span class="muted">-</span>'
    try:
        return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%H:%M:%S")
    except (OverflowError, OSError, ValueError):  # a time no clock shows: never a 500
        return '<span class="muted">?</span>'


def _timeline(c: ContainerStatus, now: float) -> str:
    """The category history as one proportional colour bar."""
    if not c.history:
        return ""
    start = c.history[0][0]
    span = max(now - start, 1e-9)
    parts = []
    for i, (t, cat) in enumerate(c.history):
        end = c.history[i + 1][0] if i + 1 < len(c.history) else now
        width = 100.0 * max(end - t, 0.0) / span
        parts.append(
            f'<span title="{escape(cat.value)}" style="width:{width:.2f}%;background:{COLOURS[cat]}"></span>'
        )
    return f'<div class="bar">{"".join(parts)}</div>'


def render_status_page(s: Status) -> str:
    rows_w = "".join(
        f"<tr><td>{escape(w.id)}</td><td>{escape(w.address)}</td>"
        f"<td>{'yes' if w.reachable else '<b>no</b>'}</td>"
        f"<td class=num>{'' if w.heartbeat_age is None else f'{w.heartbeat_age:.1f}s'}</td>"
        f"<td class=num>{w.capacity.cpu:g}</td><td class=num>{100 * w.usage:.0f}%</td>"
        f"<td class=num>{len(w.containers)}</td></tr>"
        for w in s.workers
    )
    rows_c = "".join(
        f"<tr><td>{escape(c.id)}</td><td>{escape(c.worker)}</td><td>{_badge(c.category)}</td>"
        f"<td>{escape(c.phase)}</td><td class=num>{'' if c.step is None else c.step}</td>"
        f"<td class=num>{'' if c.last_g is None else f'{c.last_g:.4g}'}</td>"
        f"<td>{'yes' if c.migrated else ''}{' (pending)' if c.pending_request else ''}</td>"
        f"<td class=num>{c.migrations}/{c.rebalances}</td>"
        f"<td class=num>{'' if c.cpu_weight is None else c.cpu_weight}</td>"
        f"<td>{_timeline(c, s.now)}</td></tr>"
        for c in s.containers
    )
    rows_m = "".join(
        f"<tr><td>{escape(m.id)}</td><td>{escape(m.container)}</td>"
        f"<td>{escape(m.source)} &rarr; {escape(m.target)}</td>"
        f"<td>{escape(m.reason)}</td><td>{escape(m.state.value)}</td><td>{_time(m.decided_at)}</td>"
        f"<td class=num>{'' if m.downtime is None else f'{m.downtime:.2f}s'}</td>"
        f"<td class=muted>{escape(m.error or '')}</td></tr>"
        for m in reversed(s.migrations)
    )
    mode = f"mode {escape(s.mode)}" + (" · <b>dry-run</b>" if s.dry_run else "")
    more = f' · <a href="/?after={quote(s.next)}">next page</a>' if s.next is not None else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{REFRESH_SECONDS}">
<title>specon manager</title><style>{_CSS}</style></head><body>
<h1>specon manager</h1>
<div class="muted">{mode} · policy generation {s.policy_generation} · {_time(s.now)} UTC ·
refreshes every {REFRESH_SECONDS}s · <a href="/v1/status">JSON</a> ·
<a href="/metrics">metrics</a>{more}</div>
<h2>Workers ({len(s.workers)} of {s.total_workers})</h2>
<table><tr><th>worker</th><th>agent</th><th>reachable</th><th>heartbeat</th><th>CPUs</th><th>R(w,t)</th>
<th>containers</th></tr>{rows_w}</table>
<h2>Containers ({len(s.containers)} of {s.total_containers})</h2>
<table><tr><th>container</th><th>worker</th><th>category</th><th>phase</th><th>step</th><th>last G</th>
<th>migrated</th><th>moves/rebal.</th><th>CPU weight</th><th>history</th></tr>{rows_c}</table>
<h2>Migrations ({len(s.migrations)} of {s.total_migrations})</h2>
<table><tr><th>id</th><th>container</th><th>move</th><th>reason</th><th>state</th><th>decided</th>
<th>downtime</th><th>error</th></tr>{rows_m}</table>
</body></html>
"""
