"""Reading training progress logs (SPEC §2): formats, auto-detection and incremental tailing.

``Tailer(path, config).poll()`` returns the new ``Sample``s of one log file;
``DirectoryTailer`` does the same for every file of a log directory; ``read_file`` reads a
finished file once. Parsers turn one line into a ``Sample`` or a counted ``SkipReason``.

- ``samples``: what reading yields (samples, typed skips, counters);
- ``parser``: the one shape of a format's parser; ``fields``: raw cells into value, step, time;
- ``jsonl``, ``csvlog``, ``text``: the formats; ``detect``: choosing one (``format: auto``);
- ``reader``: one file read incrementally by byte offset; ``tailer``: the tailers on top;
- ``last``: the last record of a JSON-lines log (how runtimes tell a job's state).
"""

from specon.progress.csvlog import CsvParser
from specon.progress.detect import detect_format, make_parser
from specon.progress.jsonl import JsonlParser
from specon.progress.parser import LineParser, LogFormat
from specon.progress.samples import ProgressStats, Sample, SkipReason
from specon.progress.tailer import DirectoryTailer, Tailer, read_file
from specon.progress.text import TextParser, compile_metric_regex

__all__ = [
    "CsvParser",
    "DirectoryTailer",
    "JsonlParser",
    "LineParser",
    "LogFormat",
    "ProgressStats",
    "Sample",
    "SkipReason",
    "Tailer",
    "TextParser",
    "compile_metric_regex",
    "detect_format",
    "make_parser",
    "read_file",
]
