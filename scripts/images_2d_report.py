#!/usr/bin/env python
"""The tables of docs/results/images_2d.md and the README's line, from the runs of scripts/images_2d.sh:

    python scripts/images_2d_report.py --runs outputs/images_2d --grid_learning_rates 1e-3 2e-3 4e-3
    python scripts/images_2d_report.py --grid_learning_rates 1e-3 2e-3 4e-3       # from the kept JSONs alone
    python scripts/images_2d_report.py --runs outputs/images_2d --choose p4-orchid-2d \\
        --grid_learning_rates 1e-3 2e-3 4e-3      # print the learning rate chosen on the validation split

The JSONs go to --results (docs/results/images_2d/); the generated blocks of --report and --readme are replaced, the
rest of those files is left as written.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ and experiments/ are not installed
from experiments.images_2d import choose_learning_rate, collect_runs, render_report, runs_in  # noqa: E402


def main(argv: list[str] | None = None) -> dict | str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=None, help="The output folder of scripts/images_2d.sh (OUT).")
    parser.add_argument("--results", default="docs/results/images_2d", help="Where the per-run JSONs are kept.")
    parser.add_argument("--report", default="docs/results/images_2d.md")
    parser.add_argument("--readme", default="README.md", help="Its images-2d block is filled too ('' for none).")
    parser.add_argument("--threads-per-run", type=int, default=1, help="Threads of each run (THREADS), for --runs.")
    parser.add_argument("--jobs", type=int, default=2, help="Runs at a time (JOBS), for --runs.")
    parser.add_argument("--choose", default=None, metavar="pPATCH-MODEL",
                        help="Print the learning rate of that grid in --runs chosen on the validation split, and "
                        "nothing else.")  # fmt: skip
    parser.add_argument("--grid_learning_rates", nargs="+", required=True, help="The grid's learning rates.")
    parser.add_argument("--block_prefix", default="", help="The prefix of the names of the blocks to fill, for a "
                        "second set of runs on the same page (e.g. 'epoch-' fills 'epoch-test').")
    args = parser.parse_args(argv)
    if args.choose:
        match = re.fullmatch(r"p(\d+)-(.+)", args.choose)
        if not args.runs or match is None:
            parser.error("--choose needs --runs and a group named pPATCH-MODEL, e.g. p4-orchid-2d")
        chosen = choose_learning_rate(runs_in(args.runs), int(match[1]), match[2], args.grid_learning_rates)
        print(chosen)
        return chosen
    if args.runs:
        names = collect_runs(args.runs, args.results, args.threads_per_run, args.jobs)
        print(f"kept {len(names)} runs in {args.results}")
    blocks = render_report(args.results, args.report, args.grid_learning_rates, args.readme or None,
                           args.block_prefix)
    print(blocks["test"])
    return blocks


if __name__ == "__main__":
    run_cli(main)
