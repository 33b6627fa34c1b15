"""Associative recall (Orchid paper, Sec. 4.1 and App. C): train one model and write its result as JSON.

    python scripts/associative_recall.py --model orchid --vocab_size 20 --seq_len 128 --steps 4000 \
        --out outputs/recall/orchid_v20_l128.json
    python scripts/associative_recall.py --table outputs/recall/*.json   # markdown table of finished runs

The learning curve goes to ``<out>.log`` (one JSON line per evaluation) while the run trains.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchid_hf.recall import CONDITIONING_LAYOUTS, MODELS, RecallConfig, plot_curves, results_table, train


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="orchid", choices=MODELS)
    parser.add_argument("--vocab_size", type=int, default=20)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--d_model", type=int, default=64)
    parser.add_argument("--n_layers", type=int, default=2)
    parser.add_argument("--transformer_positions", default="rope", choices=("rope", "learned"),
                        help="transformer only: rotary embeddings or learned absolute position embeddings")
    parser.add_argument("--conditioning", default="abs", help="abs (Type I, Eq. 2) or xcorr (Type II, Eq. 4)")
    parser.add_argument("--activation", default="identity", help="sigma of Type II: identity, sigmoid, tanh, ...")
    parser.add_argument("--transform", default="dct", help="dct or fft")
    parser.add_argument("--conditioning_layout", default="spatial+spectral", choices=tuple(CONDITIONING_LAYOUTS))
    parser.add_argument("--conditioning_depth", type=int, default=1, help="Conv1d layers per domain (3 for vocab 40)")
    parser.add_argument("--filter_spectrum", default="listing1", choices=("listing1", "convolution"),
                        help="DCT only: the static multiplier is dct(h0), as in the paper's Listing 1, or the "
                        "spectrum of a convolution with h0")
    parser.add_argument("--conditioning_norm", action="store_true",
                        help="experiment: LayerNorm in the conditioning network (not in the library operator)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--warmup_steps", type=int, default=1000)
    parser.add_argument("--weight_decay", type=float, default=0.1)
    parser.add_argument("--eval_every", type=int, default=250)
    parser.add_argument("--eval_size", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="result JSON path; the learning curve goes to <out>.log")
    parser.add_argument("--table", nargs="+", metavar="JSON", help="print a markdown table of these results")
    parser.add_argument("--plot", metavar="PNG", help="with --table: also plot the learning curves to PNG")
    parser.add_argument("--no_progress", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.table:
        sys.stdout.write(results_table(args.table))
        if args.plot:
            plot_curves(args.table, args.plot)
        return
    options = {k: v for k, v in vars(args).items() if k not in ("out", "table", "plot", "no_progress")}
    config = RecallConfig(**options)
    config.validate()
    out = Path(args.out) if args.out else None
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
    command = "python scripts/associative_recall.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = train(
        config,
        log_path=f"{out}.log" if out else None,
        progress=not args.no_progress,
        result_path=out,
        extra={"command": command},
    )
    print(f"final test accuracy {result['test_accuracy']:.4f} (best {result['best_test_accuracy']:.4f}) "
          f"in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
