"""Benchmarks (``make bench``): each module ``bench/bench_*.py`` measures and reports.

A benchmark module defines ``run(quick: bool) -> list[Figure]``. The runner prints every
figure next to its target and writes ``bench/results/<module>.json``. Targets are
reported, never asserted: tests check behaviour, benchmarks measure speed.
"""
