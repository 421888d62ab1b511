"""Benchmarks (``make bench``): each module ``bench/bench_*.py`` measures and reports.

A benchmark module defines ``run(quick: bool) -> list[Figure]`` (with ``out: Path``, the
runner's ``--out``, where it also writes tables). The runner prints every figure next to
its target and writes ``<out>/<module>.json`` (``bench/results/`` by default). Targets are
reported, never asserted: tests check behaviour, benchmarks measure speed. ``figures``: the
``Figure`` they report in; ``baseline``: the regression guard, each figure against the
committed ``bench/baseline.json`` (``make bench`` ends with what moved over 10 % the wrong way).
"""
