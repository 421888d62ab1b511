"""The status page's job cards: per job its loss curve, a progress bar against its declared
steps with the time left, its category history as a strip, its migrations, and its GPU use
(memory, devices, utilisation, frozen or suspended by the GPU sharing).

The curve is an inline SVG drawn here from the window its agent reported
(``specon.wire.status.LossWindow``): no script, no image fetched from anywhere. Pure: a ``Status`` in,
HTML out, every text from outside (ids, labels, the metric's name) escaped.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections.abc import Iterable, Sequence
from html import escape

from specon.model import Category
from specon.wire.gpu import GpuUse
from specon.wire.status import ContainerStatus, LossWindow, MigrationStatus, Status

COLOURS = {
    Category.PROGRESSING: "#2e7d32",
    Category.WATCHING: "#f9a825",
    Category.CONVERGED: "#1565c0",
    Category.DIVERGING: "#c62828",
    Category.STALLED: "#757575",
}
# The curve's box (SVG user units = CSS pixels) and its inner margin.
CURVE_W, CURVE_H, _PAD = 260, 70, 4
# Moves listed on a card (the newest; the migrations table has them all).
MOVES_SHOWN = 3
# Curves kept drawn (about 1.5 kB each): a page's worth several times over.
CURVES_CACHED = 4096

CSS = """
.jobs{display:grid;grid-template-columns:repeat(auto-fill,minmax(19rem,1fr));gap:.7rem}
.job{border:1px solid #ddd;border-radius:.4rem;padding:.5rem .6rem;font-size:.85rem}
.job h3{font-size:.92rem;margin:0 0 .3rem;display:flex;gap:.4rem;align-items:center;flex-wrap:wrap}
.job h3 a{color:inherit;text-decoration:none} .job .where{font-weight:normal;color:#777}
.curve{display:block;background:#fafafa;border-radius:.2rem}
.curve polyline{fill:none;stroke:#1565c0;stroke-width:1.6}
.curve text{font-size:9px;fill:#777} .curve .none{font-size:11px}
.prog{height:.6rem;background:#eee;border-radius:.2rem;overflow:hidden;margin:.35rem 0 .15rem}
.prog span{display:block;height:100%;background:#546e7a}
.job .bar{width:auto;height:.35rem;margin:.35rem 0 .2rem} .job ul{margin:.2rem 0 0;padding-left:1.1rem}
"""


def badge(cat: Category) -> str:
    return f'<span class="badge" style="background:{COLOURS[cat]}">{escape(cat.value)}</span>'


def clock(t: float | None) -> str:
    """A manager time as HH:MM:SS UTC; a dash for none, '?' for one no clock shows."""
    if t is None:
        return '<span class="muted">-</span>'
    try:
        return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%H:%M:%S")
    except (OverflowError, OSError, ValueError):  # never a 500
        return '<span class="muted">?</span>'


def duration(seconds: float) -> str:
    """Seconds in the largest two units that matter: "45 s", "3 min 20 s", "2 h 5 min"."""
    if not math.isfinite(seconds) or seconds >= 365 * 86_400:
        return "over a year"
    s = max(0, round(seconds))
    for unit, size, sub, sub_size in (("d", 86_400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if s >= size:
            rest = (s % size) // sub_size
            return f"{s // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{s} s"


def _number(x: float) -> str:
    return f"{x:.4g}"


def timeline(c: ContainerStatus, now: float) -> str:
    """The category history as one proportional colour strip, oldest on the left."""
    if not c.history:
        return ""
    start = c.history[0][0]
    span = max(now - start, 1e-9)
    parts = []
    for i, (t, cat) in enumerate(c.history):
        end = c.history[i + 1][0] if i + 1 < len(c.history) else now
        width = min(100.0, 100.0 * max(end - t, 0.0) / span)
        style = f"width:{width:.2f}%;background:{COLOURS[cat]}"
        parts.append(f'<span title="{cat.value} {duration(end - t)}" style="{style}"></span>')
    return f'<div class="bar" title="category history">{"".join(parts)}</div>'


def _heights(values: Sequence[float]) -> list[int]:
    """``values`` as heights 0 (lowest) to ``_LEVELS`` (highest); all equal: half way. Halved
    first, so that the span of two finite floats never overflows to infinity."""
    lo, hi = min(values) / 2, max(values) / 2
    span = hi - lo
    if span <= 0:
        return [_LEVELS // 2] * len(values)
    scale = _LEVELS / span
    return [round((v / 2 - lo) * scale) for v in values]


# The curve's own grid: x the point's index, y 0 (top) to _LEVELS, stretched onto the plot's
# box by a nested <svg> (integers are what a page of a thousand curves formats fastest).
_LEVELS = 1000
_LEFT = 38  # room for the loss labels
_PLOT_W, _PLOT_H = CURVE_W - _LEFT - _PAD, CURVE_H - 2 * _PAD - 10


@functools.lru_cache(maxsize=CURVES_CACHED)
def loss_curve(window: LossWindow | None) -> str:
    """The window as an SVG line over its steps, the highest and lowest loss at the left.
    Cached: the manager keeps a window until its agent sends a new one (every tick at most),
    while a watched page is built every second."""
    head = (
        f'<svg class="curve" width="{CURVE_W}" height="{CURVE_H}" viewBox="0 0 {CURVE_W} {CURVE_H}" '
        'role="img" xmlns="http://www.w3.org/2000/svg"'
    )
    if window is None or not window.loss:
        none = f'<text class="none" x="8" y="{CURVE_H // 2}">no loss curve yet</text>'
        return f'{head} aria-label="no loss curve yet">{none}</svg>'
    loss = window.loss
    metric = escape(window.metric or "loss")
    n = len(loss)
    ys = [_LEVELS - h for h in _heights(loss)]
    if n > 1:
        points = " ".join([f"{i},{y}" for i, y in enumerate(ys)])
        shape = (
            f'<svg x="{_LEFT}" y="{_PAD}" width="{_PLOT_W}" height="{_PLOT_H}" '
            f'viewBox="0 0 {n - 1} {_LEVELS}" preserveAspectRatio="none">'
            f'<polyline points="{points}" vector-effect="non-scaling-stroke"/></svg>'
        )
    else:
        cy = _PAD + _PLOT_H * ys[0] / _LEVELS
        shape = f'<circle cx="{_LEFT + _PLOT_W / 2:.1f}" cy="{cy:.1f}" r="2.5" fill="#1565c0"/>'
    label = (
        f"{metric} over steps {window.first_step:,}-{window.last_step:,}: "
        f"{_number(loss[0])} to {_number(loss[-1])}"
    )
    base = CURVE_H - 2
    return (
        f'{head} aria-label="{label}"><title>{label}</title>{shape}'
        f'<text x="2" y="{_PAD + 8}">{_number(max(loss))}</text>'
        f'<text x="2" y="{_PAD + _PLOT_H}">{_number(min(loss))}</text>'
        f'<text x="{_LEFT}" y="{base}">{metric} · step {window.first_step:,}</text>'
        f'<text x="{CURVE_W - _PAD}" y="{base}" text-anchor="end">{window.last_step:,}</text></svg>'
    )


def progress(c: ContainerStatus) -> str:
    """The bar against the declared steps (none without a total) and the line under it."""
    step = c.step
    if c.total_steps is None or c.total_steps <= 0:
        shown = "no step logged yet" if step is None else f"step {step:,}"
        return f'<div class="muted">{shown} · no declared total</div>'
    done = 0.0 if step is None else min(1.0, step / c.total_steps)
    left = (
        "finished"
        if c.phase == "finished"
        else (f"{duration(c.eta)} left" if c.eta is not None else "time left unknown yet")
    )
    steps = f"{'-' if step is None else f'{step:,}'} / {c.total_steps:,} steps"
    return (
        f'<div class="prog" role="progressbar" aria-valuenow="{100 * done:.1f}" aria-valuemin="0" '
        f'aria-valuemax="100"><span style="width:{100 * done:.1f}%"></span></div>'
        f"<div>{steps} · {100 * done:.1f} % · {left}</div>"
    )


def moves(c: ContainerStatus, listed: Sequence[MigrationStatus]) -> str:
    """Its move counts, and the newest of its migrations this page lists."""
    if not (c.migrations or c.rebalances or listed or c.pending_request):
        return '<div class="muted">not moved</div>'
    counts = f"migrations {c.migrations} · rebalances {c.rebalances}"
    if c.pending_request:
        counts += " · <b>asks to move</b>"
    items = "".join(
        f"<li>{escape(m.source)} &rarr; {escape(m.target)} · {escape(m.reason)} · {escape(m.state.value)}"
        f" · {clock(m.decided_at)}{'' if m.downtime is None else f' · down {m.downtime:.1f} s'}</li>"
        for m in listed[-MOVES_SHOWN:]
    )
    return f"<div>{counts}</div>" + (f"<ul>{items}</ul>" if items else "")


def anchor(cid: str) -> str:
    """The id of a job's card (its workers link to it)."""
    return f"job-{escape(cid)}"


def job_card(c: ContainerStatus, now: float, listed: Sequence[MigrationStatus]) -> str:
    model = c.job.get("model")
    shown_model = f' <span class="where">{escape(model)}</span>' if model else ""
    return (
        f'<section class="job" id="{anchor(c.id)}"><h3><a href="#{anchor(c.id)}">{escape(c.id)}</a> '
        f'{badge(c.category)}<span class="where">{escape(c.phase)} on {escape(c.worker)}</span>'
        f"{shown_model}</h3>{loss_curve(c.window)}{progress(c)}{timeline(c, now)}{moves(c, listed)}"
        f"{_details(c)}</section>"
    )


def _details(c: ContainerStatus) -> str:
    """What Algorithm 1 and the priority action last said of it."""
    parts = []
    if c.last_g is not None:
        parts.append(f"G {c.last_g:.4g}")
    if c.migrated:
        parts.append("frozen (migrated)")
    if c.cpu_weight is not None:
        parts.append(f"CPU weight {c.cpu_weight}")
    if c.gpu is not None:
        parts.append(_gpu_use(c.gpu))
    return f'<div class="muted">{" · ".join(parts)}</div>' if parts else ""


def _gpu_use(g: GpuUse) -> str:
    """Its GPU memory, devices, utilisation and, unless it runs, its state under GPU sharing."""
    text = f"GPU {g.memory / 2**30:.1f} GiB"
    if g.devices:
        text += f" on {','.join(map(str, g.devices))}"
    if g.utilisation is not None:
        text += f" · {g.utilisation:.0f} %"
    return text if g.state == "running" else f"{text} · <b>{escape(g.state)}</b>"


def by_container(migrations: Iterable[MigrationStatus]) -> dict[str, list[MigrationStatus]]:
    out: dict[str, list[MigrationStatus]] = {}
    for m in migrations:
        out.setdefault(m.container, []).append(m)
    for ms in out.values():
        ms.sort(key=lambda m: m.decided_at)
    return out


def render_jobs(s: Status) -> str:
    """The jobs section: one card per container on this page."""
    moved = by_container(s.migrations)
    cards = "".join(job_card(c, s.now, moved.get(c.id, ())) for c in s.containers)
    return (
        f"<h2>Jobs ({len(s.containers)} of {s.total_containers})</h2>"
        f'<div class="jobs">{cards or "<p class=muted>none on this page</p>"}</div>'
    )
