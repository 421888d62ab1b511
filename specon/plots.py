"""PNG plots of replayed logs: the metric with coloured category bands (``classify --plot``).

Uses matplotlib's object API with the Agg canvas directly, never ``pyplot``, so no
global backend state is touched and no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from specon.model import Category
from specon.replay import ReplayResult

COLOURS = {
    Category.PROGRESSING: "#a6d96a",
    Category.WATCHING: "#fee08b",
    Category.CONVERGED: "#74add1",
    Category.DIVERGING: "#f46d43",
    Category.STALLED: "#bdbdbd",
}
REQUEST_COLOUR = "#d73027"


def bands(result: ReplayResult) -> list[tuple[float, float, Category]]:
    """``(start, end, category)`` spans covering [0, end of the last tick]."""
    spans: list[tuple[float, float, Category]] = []
    start, current = 0.0, Category.PROGRESSING
    for tr in result.transitions:
        if tr.t > start:
            spans.append((start, tr.t, current))
        start, current = tr.t, tr.target
    end = max(result.end, start)
    if end > start or not spans:
        spans.append((start, end, current))
    return spans


def plot_replays(
    results: Sequence[tuple[str, ReplayResult]], out: Path, *, metric: str = "loss", dpi: int = 100
) -> None:
    """One subplot per file: the metric over time on its category bands; a PNG at ``out``."""
    if not results:
        raise ValueError("nothing to plot")
    fig = Figure(figsize=(9.0, 2.6 * len(results)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(results), 1, squeeze=False)[:, 0]
    seen: set[Category] = set()
    for ax, (label, result) in zip(axes, results, strict=True):
        for start, end, category in bands(result):
            ax.axvspan(start, end, color=COLOURS[category], alpha=0.5, linewidth=0)
            seen.add(category)
        if result.points:
            ts, values = zip(*result.points, strict=True)
            ax.plot(ts, values, color="black", linewidth=0.8)
        if result.request_at is not None:
            ax.axvline(result.request_at, color=REQUEST_COLOUR, linestyle="--", linewidth=1.0)
        ax.set_title(label, fontsize=9, loc="left")
        ax.set_ylabel(metric)
        ax.set_xlim(0.0, max(result.end, 1.0))
    axes[-1].set_xlabel("seconds since the first record")
    handles: list[Artist] = [Patch(color=COLOURS[c], alpha=0.5, label=c.value) for c in COLOURS if c in seen]
    if any(r.request_at is not None for _, r in results):
        handles.append(Line2D([], [], color=REQUEST_COLOUR, linestyle="--", label="request"))
    fig.legend(handles=handles, loc="outside upper right", ncols=len(handles), fontsize=8)
    fig.savefig(out, format="png", dpi=dpi)
