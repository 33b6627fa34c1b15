#!/usr/bin/env python
"""The seeds of long-context settings side by side, from their run files:

    python scripts/long_context_seeds.py --runs docs/results/long_context_causes \\
        --setting o128="Orchid 128" --setting o2048-nopos-std03="Orchid 2048, orchid-bert-long" \\
        --compare o2048-nopos-std03 o128

reads SETTING.json (seed 0) and SETTING-sN.json (seed N) of each setting, and prints (or writes, ``--output``) a
table of each setting's held-out accuracies (all masked tokens and far ones, reading 128, 512 and 2,048 tokens) with
each seed's value, and for each ``--compare FIRST SECOND`` the difference of the means with its 95% interval, stated
only from three seeds a side. See experiments/real_data/long_context.py and docs/results/long_context.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/ is not installed
from experiments.real_data.long_context import seed_groups, seed_tables  # noqa: E402


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", required=True, help="the folder of run files")
    parser.add_argument("--setting", action="append", required=True, metavar="NAME=LABEL",
                        help="a setting (the run files' name without -sN) and its label in the tables")
    parser.add_argument("--compare", nargs=2, action="append", default=[], metavar=("FIRST", "SECOND"))
    parser.add_argument("--output", default=None, help="write the tables to this file instead of printing them")
    args = parser.parse_args(argv)
    names = dict(setting.split("=", 1) if "=" in setting else (setting, setting) for setting in args.setting)
    unknown = sorted({name for pair in args.compare for name in pair} - set(names))
    if unknown:
        parser.error(f"--compare names settings not given with --setting: {unknown}")
    tables = seed_tables(seed_groups(args.runs, list(names)), names, [tuple(pair) for pair in args.compare])
    if args.output:
        Path(args.output).write_text(tables)
    else:
        print(tables, end="")
    return tables


if __name__ == "__main__":
    main()
