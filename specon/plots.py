"""PNG plots: replayed logs with category bands (``classify --plot``), demo timelines and JCTs.

Uses matplotlib's object API with the Agg canvas directly, never ``pyplot``, so no
global backend state is touched and no display is needed.

matplotlib is the optional ``plot`` extra, and this is the only module that imports it (an
import contract): the daemons never load it, and the CLI imports this module only when a
command plots. Without matplotlib, importing this module raises ``ImportError``
saying which extra to install, which the CLI prints instead of a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specon.evaluation import JobResult, RunResult
from specon.model import Category
from specon.policy.replay import ReplayResult

try:
    from matplotlib.artist import Artist
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
except ImportError as exc:  # the optional `plot` extra is not installed
    raise ImportError(
        "plotting needs matplotlib, which is not installed: install the 'plot' extra "
        "(pip install 'specon[plot]')",
        name=exc.name,
    ) from exc

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


MODEL_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666")


def _segments(job: JobResult, end: float) -> list[tuple[float, float, str]]:
    """``(start, stop, worker)`` for each stay of a job on a worker."""
    hist = list(job.worker_history)
    stop = job.finish if job.finish is not None else end
    return [(t, hist[i + 1][0] if i + 1 < len(hist) else stop, w) for i, (t, w) in enumerate(hist)]


def plot_timelines(runs: Sequence[tuple[str, RunResult]], out: Path, *, dpi: int = 100) -> None:
    """Per-worker container timelines, one panel per run (in the spirit of SpeCon Fig. 8/9).

    Each job is a bar on the worker that hosts it, coloured by model; a job that moved
    continues on its new worker's row, the move marked "M" (converged) or "R" (rebalance).
    """
    if not runs:
        raise ValueError("nothing to plot")
    workers = sorted({w for _, r in runs for j in r.jobs for _, w in j.worker_history})
    models = sorted({j.model for _, r in runs for j in r.jobs})
    colour = {m: MODEL_COLOURS[i % len(MODEL_COLOURS)] for i, m in enumerate(models)}
    end = (
        max((j.finish or j.submit) for _, r in runs for j in r.jobs) if any(r.jobs for _, r in runs) else 1.0
    )
    fig = Figure(figsize=(11.0, 1.2 + 0.9 * len(workers) * len(runs)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(runs), 1, squeeze=False, sharex=True)[:, 0]
    for ax, (label, run) in zip(axes, runs, strict=True):
        lanes: dict[str, list[float]] = {w: [] for w in workers}  # per worker: lane end times
        reasons = {(m.job, m.target): m.reason for m in run.migrations}
        for job in sorted(run.jobs, key=lambda j: j.submit):
            for seg, (start, stop, w) in enumerate(_segments(job, end)):
                ends = lanes[w]
                lane = next((i for i, e in enumerate(ends) if e <= start), len(ends))
                if lane == len(ends):
                    ends.append(stop)
                else:
                    ends[lane] = stop
                y = workers.index(w) + 0.08 + 0.84 * (lane % 8) / 8
                ax.broken_barh([(start, max(stop - start, 0.5))], (y, 0.84 / 8), color=colour[job.model])
                tag = job.id.removeprefix("job-")
                # The first segment is the initial placement; later ones arrived by a move.
                reason = reasons.get((job.id, w), "") if seg > 0 else ""
                mark = {"converged": "-M", "rebalance": "-R"}.get(reason, "")
                ax.text(start + 1, y + 0.05, tag + mark, fontsize=6, va="bottom")
        ax.set_yticks([i + 0.5 for i in range(len(workers))], labels=workers)
        ax.set_ylim(0, len(workers))
        ax.set_title(label, fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("seconds since the first submission")
    handles: list[Artist] = [Patch(color=colour[m], label=m) for m in models]
    fig.legend(handles=handles, loc="outside upper right", ncols=len(handles), fontsize=8)
    fig.savefig(out, format="png", dpi=dpi)


def plot_jct_bars(
    baseline: RunResult,
    run: RunResult,
    out: Path,
    *,
    labels: tuple[str, str] = ("DS", "specon"),
    dpi: int = 100,
) -> None:
    """Per-job JCT, baseline beside specon (in the spirit of SpeCon Fig. 5)."""
    ids = [j.id for j in baseline.jobs]
    base = {j.id: j.jct for j in baseline.jobs}
    ours = {j.id: j.jct for j in run.jobs}
    fig = Figure(figsize=(max(6.0, 0.55 * len(ids) + 2), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    xs = list(range(len(ids)))
    ax.bar([x - 0.2 for x in xs], [base[i] or 0.0 for i in ids], width=0.4, label=labels[0], color="#9e9e9e")
    ax.bar(
        [x + 0.2 for x in xs], [ours.get(i) or 0.0 for i in ids], width=0.4, label=labels[1], color="#1565c0"
    )
    ax.set_xticks(xs, labels=[i.removeprefix("job-") for i in ids], fontsize=8)
    ax.set_xlabel("job")
    ax.set_ylabel("JCT (s)")
    avg_b, avg_o = baseline.avg_jct, run.avg_jct
    if avg_b is not None and avg_o is not None:
        ax.set_title(
            f"average JCT {labels[0]} {avg_b:.0f}s, {labels[1]} {avg_o:.0f}s", fontsize=10, loc="left"
        )
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(out, format="png", dpi=dpi)


def plot_jct_cdfs(
    series: Sequence[tuple[str, Sequence[float]]], out: Path, *, title: str = "", dpi: int = 100
) -> None:
    """Empirical CDFs of job completion times, one line per label (the simulator's policies)."""
    if not series:
        raise ValueError("nothing to plot")
    fig = Figure(figsize=(7.0, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for i, (label, values) in enumerate(series):
        xs = sorted(values)
        if not xs:
            continue
        ys = [(k + 1) / len(xs) for k in range(len(xs))]
        ax.step(xs, ys, where="post", label=label, color=MODEL_COLOURS[i % len(MODEL_COLOURS)], linewidth=1.2)
    ax.set_xlabel("JCT (s)")
    ax.set_ylabel("share of jobs")
    ax.set_ylim(0.0, 1.0)
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(out, format="png", dpi=dpi)


def plot_learning_curve(
    imitation: Sequence[tuple[int, float, float]],
    rl: Sequence[tuple[int, float | None, float | None]],
    teacher: float,
    out: Path,
    *,
    dpi: int = 100,
) -> None:
    """``specon learn``'s curve: imitation's loss and agreement per epoch (left), and the
    average JCT against DS of the sampled episodes and of the greedy order on the validation
    set per actor-critic iteration, beside the teacher's (right)."""
    fig = Figure(figsize=(10.0, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    if imitation:
        epochs = [e for e, _, _ in imitation]
        left.plot(epochs, [loss for _, loss, _ in imitation], color="#1565c0", label="cross-entropy")
        left.set_ylabel("cross-entropy of the teacher's order")
        agree = left.twinx()
        agree.plot(epochs, [100 * a for _, _, a in imitation], color="#ef6c00", label="agreement")
        agree.set_ylabel("first job as the teacher's (%)")
        left.legend(
            handles=[
                Line2D([], [], color="#1565c0", label="cross-entropy"),
                Line2D([], [], color="#ef6c00", label="agreement"),
            ],
            fontsize=8,
            loc="center right",
        )
    left.set_xlabel("imitation epoch")
    left.set_title("1. imitation of the default", fontsize=10, loc="left")
    train = [(i, 100 * t) for i, t, _ in rl if t is not None]
    val = [(i, 100 * v) for i, _, v in rl if v is not None]
    if train:
        right.plot(*zip(*train, strict=True), color="#9e9e9e", lw=0.8, label="sampled episodes")
    if val:
        right.plot(*zip(*val, strict=True), color="#1565c0", marker="o", ms=3, label="greedy, validation")
    right.axhline(100 * teacher, color="#ef6c00", ls="--", label="teacher (default), validation")
    right.set_xlabel("actor-critic iteration (0: after imitation)")
    right.set_ylabel("average JCT vs DS (%)")
    right.set_title("2. actor-critic with replay", fontsize=10, loc="left")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    fig.savefig(out, format="png", dpi=dpi)


def plot_plane(
    title: str,
    peers: Sequence[tuple[str, float, float]],
    sweep: Sequence[tuple[str, float, float]],
    out: Path,
    *,
    default: str = "specon",
    sweep_label: str = "",
    dpi: int = 100,
) -> None:
    """The JCT-quality plane (``specon.sim.plane``): one point per policy, ``(label, average JCT
    change, time-to-quality change)`` against DS in %, DS at the origin, the default's knob
    sweep as a line labelled by its values; the quadrant that would dominate the default is
    shaded, so a peer inside it beats the default on both axes."""
    fig = Figure(figsize=(7.5, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.axhline(0.0, color="#bdbdbd", lw=0.8)
    ax.axvline(0.0, color="#bdbdbd", lw=0.8)
    ax.plot([0.0], [0.0], marker="s", color="#616161", ls="none")
    ax.annotate("DS", (0.0, 0.0), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if sweep:
        xs, ys = [x for _, x, _ in sweep], [y for _, _, y in sweep]
        ax.plot(xs, ys, color="#1565c0", lw=1.2, marker=".", ms=5, label=sweep_label or "default, swept")
        for label, x, y in sweep:
            ax.annotate(
                label, (x, y), textcoords="offset points", xytext=(3, -9), fontsize=7, color="#1565c0"
            )
    for label, x, y in peers:
        mine = label == default
        ax.plot([x], [y], marker="*" if mine else "o", ms=12 if mine else 6,
                color="#d84315" if mine else "#424242", ls="none")  # fmt: skip
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=8,
                    fontweight="bold" if mine else "normal")  # fmt: skip
        if mine:
            left, bottom = ax.get_xlim()[0], ax.get_ylim()[0]
            ax.fill_between([min(left, x) - 1e3, x], min(bottom, y) - 1e3, y, color="#ffccbc", alpha=0.35,
                            label="better than the default on both axes")  # fmt: skip
    ax.autoscale_view()
    xs_all = [x for _, x, _ in (*peers, *sweep)] + [0.0]
    ys_all = [y for _, _, y in (*peers, *sweep)] + [0.0]
    pad_x = 0.08 * (max(xs_all) - min(xs_all) or 1.0)
    pad_y = 0.08 * (max(ys_all) - min(ys_all) or 1.0)
    ax.set_xlim(min(xs_all) - pad_x, max(xs_all) + 3 * pad_x)
    ax.set_ylim(min(ys_all) - pad_y, max(ys_all) + pad_y)
    ax.set_xlabel("average JCT vs DS (%)")
    ax.set_ylabel("time-to-quality vs DS (%)")
    ax.set_title(title, fontsize=10, loc="left")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.savefig(out, format="png", dpi=dpi)
