"""Reading training progress logs (SPEC §2): formats, auto-detection and incremental tailing.

``Tailer(path, config).poll()`` returns the new ``Sample``s of one log file;
``DirectoryTailer`` does the same for every file of a log directory; ``read_log`` (and
``read_file``) reads a finished file once. Parsers turn one line into a ``Sample`` or a
counted ``SkipReason``; the formats with framings of their own read the whole file. The
formats and rules for people: docs/logs.md.

- ``samples``: what reading yields (samples, typed skips, counters, the unreadable-log error);
- ``parser``: the shapes of a format's reader (line by line, whole file); ``fields``: raw
  cells into value, step, time;
- ``metric``: which metric a log is read for (the rule when ``loss`` is absent) and what to
  say when a log yields none;
- ``jsonl``, ``csvlog``, ``text``: the line formats (``text`` also reads printed dicts, the
  Hugging Face Trainer's console lines); ``trainer_state``: Hugging Face
  ``trainer_state.json``; ``tfevents``: TensorBoard event files (the ``tensorboard`` extra,
  imported only there); ``detect``: choosing one (``format: auto``);
- ``reader``: one file read incrementally by byte offset; ``tailer``: the tailers on top;
- ``spacing``: the time between records without timestamps (``specon classify``);
  ``filetimes``: a file's lifetime (birth to last modification);
- ``last``: the last record of a JSON-lines log (how runtimes tell a job's state).
"""

from specon.progress.csvlog import CsvParser
from specon.progress.detect import detect_format, make_parser
from specon.progress.jsonl import JsonlParser
from specon.progress.metric import MetricChoice
from specon.progress.parser import LineParser, LogFormat
from specon.progress.samples import ProgressStats, Sample, SkipReason, UnreadableLogError
from specon.progress.tailer import DirectoryTailer, LogRead, Tailer, read_file, read_log
from specon.progress.text import TextParser, compile_metric_regex

__all__ = [
    "CsvParser",
    "DirectoryTailer",
    "JsonlParser",
    "LineParser",
    "LogFormat",
    "LogRead",
    "MetricChoice",
    "ProgressStats",
    "Sample",
    "SkipReason",
    "Tailer",
    "TextParser",
    "UnreadableLogError",
    "compile_metric_regex",
    "detect_format",
    "make_parser",
    "read_file",
    "read_log",
]
