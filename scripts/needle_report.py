#!/usr/bin/env python
"""Tables of needle-benchmark runs (scripts/needle_benchmark.py), side by side:

    python scripts/needle_report.py --run "Orchid=outputs/needle/orchid-s0" --run "Orchid=outputs/needle/orchid-s1" \\
        --run "BERT=outputs/needle/bert-s0" --compare Orchid BERT --output needle_tables.md

Each --run is LABEL=RUN_DIR (a folder with results.json); runs with the same label are seeds of one model. Prints
(or writes to --output) accuracy per task and length with each seed's value, the time and memory of reading a
haystack and of a fine-tuning step, and for each --compare pair the difference per task and length with its 95%
interval over seeds (none is stated below three seeds a model). See experiments/needle.py (`report`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/ is not installed
from experiments.needle import report  # noqa: E402


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=RUN_DIR",
                        help="A run folder and the label of its model; repeat the label for each seed.")  # fmt: skip
    parser.add_argument("--compare", nargs=2, action="append", default=[], metavar=("FIRST", "SECOND"),
                        help="Two labels whose accuracies to compare, with intervals over seeds.")  # fmt: skip
    parser.add_argument("--output", help="Write the tables to this file (default: print them).")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {}
    for entry in args.run:
        label, separator, folder = entry.partition("=")
        if not separator or not label or not folder:
            raise ValueError(f"--run {entry!r}: give LABEL=RUN_DIR")
        path = Path(folder) / "results.json"
        if not path.is_file():
            raise ValueError(f"--run {entry!r}: {path} does not exist (a folder that scripts/needle_benchmark.py "
                             "wrote)")  # fmt: skip
        runs.setdefault(label, []).append(json.loads(path.read_text()))
    text = report(runs, [tuple(pair) for pair in args.compare])
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return text


if __name__ == "__main__":
    run_cli(main)
