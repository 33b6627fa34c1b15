#!/usr/bin/env python
"""Tables, plots and the README's headline table of docs/results/real_data.md, and those of
docs/results/long_context.md:

    python scripts/real_data_report.py --runs outputs/real_data     # keep one JSON per finished run, then render
    python scripts/real_data_report.py                              # render from the kept JSONs alone
    python scripts/real_data_report.py --runs outputs/real_data --choose grid-attribution-128-orchid-pretrained \
        --grid_poolings first mean --grid_learning_rates 1e-4 3e-4 1e-3 3e-3
                                                  # print the grid's pooling and learning rate, chosen on the
                                                  # validation chapters (scripts/real_data.sh)

The JSONs go to --results (docs/results/real_data/); the generated blocks of --report, --readme and
--context_report are replaced, the rest of those files is left as written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ and experiments/ are not installed
from experiments.real_data.report import choose_grid_point, collect_runs, render_report  # noqa: E402


def main(argv: list[str] | None = None) -> dict | str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=None, help="The output folder of scripts/real_data.sh (OUT).")
    parser.add_argument("--results", default="docs/results/real_data", help="Where the per-run JSONs are kept.")
    parser.add_argument("--report", default="docs/results/real_data.md")
    parser.add_argument("--readme", default="README.md", help="Its headline block is filled too ('' for none).")
    parser.add_argument("--context_report", default="docs/results/long_context.md",
                        help="The long-context comparison's report, filled where there are its runs ('' for none).")
    parser.add_argument("--threads-per-run", type=int, default=1, help="Threads of each run (THREADS), for --runs.")
    parser.add_argument("--jobs", type=int, default=2, help="Runs at a time (JOBS), for --runs.")
    parser.add_argument("--choose", default=None, metavar="GROUP",
                        help="Print the pooling and learning rate ('POOLING LR') of the grid GROUP-POOLING-lrLR-s0 in "
                        "--runs chosen on the validation chapters, and nothing else.")  # fmt: skip
    parser.add_argument("--grid_learning_rates", nargs="+", default=[], help="The grid's learning rates, for --choose.")
    parser.add_argument("--grid_poolings", nargs="+", default=["first", "mean"], choices=["first", "mean"],
                        help="The grid's poolings, for --choose.")  # fmt: skip
    args = parser.parse_args(argv)
    if args.choose:
        if not args.runs or not args.grid_learning_rates:
            parser.error("--choose needs --runs and --grid_learning_rates")
        chosen = choose_grid_point(args.runs, args.choose, args.grid_learning_rates, args.grid_poolings)
        print(chosen)
        return chosen
    if args.runs:
        names = collect_runs(args.runs, args.results, args.threads_per_run, args.jobs)
        print(f"kept {len(names)} runs in {args.results}")
    blocks = render_report(args.results, args.report, args.readme or None, args.context_report or None)
    print(blocks["headline"])
    return blocks


if __name__ == "__main__":
    run_cli(main)
