"""Associative recall (Orchid paper, Sec. 4.1 and App. C): train one model and write its result as JSON.

    python scripts/associative_recall.py --model orchid --vocab_size 20 --seq_len 128 \
        --out outputs/recall/orchid_v20_l128.json
    python scripts/associative_recall.py --model transformer --vocab_size 20 --out outputs/recall/bert_v20_l128.json
    python scripts/associative_recall.py --table outputs/recall/*.json --plot curves.png   # table of finished runs
    python scripts/associative_recall.py --update_page docs/results/associative_recall.md \
        --runs docs/results/recall_runs   # the page's generated tables and figures

Models: ``orchid`` (OrchidForMaskedLM, preset ``orchid-recall``), ``static`` (the same with
``data_dependent=False``), ``transformer`` (transformers' BertForMaskedLM of the same width and depth) and ``gpt2``
(GPT2LMHeadModel, causal and pre-norm). ``--objective next_token`` trains on the next token at every position, as
the paper does; the default trains on the query position only.
The learning curve goes to ``<out>.log`` (one JSON line per evaluation) while the run trains, and a checkpoint to
``<out>.ckpt``: the same command started again after a stop resumes from it (it is removed when the run ends).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from orchid_hf.modeling.orchid_layers import CONDITIONING_ACTIVATIONS, CONDITIONINGS, FILTER_SPECTRA, TRANSFORMS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ and experiments/ are not installed
from experiments.recall import (  # noqa: E402
    CONDITIONING_LAYOUTS,
    MODELS,
    OBJECTIVES,
    TRANSFORMER_POSITIONS,
    RecallConfig,
    plot_curves,
    render_page,
    results_table,
    train,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = RecallConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=defaults.model, choices=MODELS)
    parser.add_argument("--objective", default=defaults.objective, choices=OBJECTIVES,
                        help="query: the loss at the query position only; next_token: the next token's loss at every "
                        "position, as Hyena's synthetics and the paper train")
    parser.add_argument("--vocab_size", type=int, default=defaults.vocab_size)
    parser.add_argument("--seq_len", type=int, default=defaults.seq_len)
    parser.add_argument("--hidden_size", type=int, default=defaults.hidden_size)
    parser.add_argument("--num_layers", type=int, default=defaults.num_layers)
    parser.add_argument("--num_heads", type=int, default=defaults.num_heads, help="transformer and gpt2 only")
    parser.add_argument("--transform", default=defaults.transform, choices=TRANSFORMS)
    parser.add_argument("--conditioning", default=defaults.conditioning, choices=CONDITIONINGS,
                        help="abs (Type I, Eq. 2) or xcorr (Type II, Eq. 4)")
    parser.add_argument("--activation", default=defaults.activation, choices=CONDITIONING_ACTIVATIONS,
                        help="sigma of Type II")
    parser.add_argument("--conditioning_layout", default=defaults.conditioning_layout,
                        choices=tuple(CONDITIONING_LAYOUTS))
    parser.add_argument("--conditioning_depth", type=int, default=defaults.conditioning_depth,
                        help="Conv1d layers per domain (3 for vocabulary 40)")
    parser.add_argument("--filter_spectrum", default=defaults.filter_spectrum, choices=FILTER_SPECTRA,
                        help="DCT only: the static multiplier is dct(h0), as in the paper's Listing 1, or the "
                        "spectrum of a convolution with h0")
    parser.add_argument("--conditioning_norm", action="store_true",
                        help="experiment: LayerNorm in the conditioning network (not in the library operator)")
    parser.add_argument("--transformer_positions", default=defaults.transformer_positions,
                        choices=TRANSFORMER_POSITIONS, help="transformer only: BERT's learned table, the same table "
                        "started from sinusoids, or rotary attention (RoFormerForMaskedLM)")
    parser.add_argument("--transformer_shift", action="store_true",
                        help="diagnostic (transformer): a depthwise convolution of length 3 over the word embeddings")
    parser.add_argument("--embedding_init_std", type=float, default=defaults.embedding_init_std)
    parser.add_argument("--config_overrides", type=json.loads, default={}, metavar="JSON",
                        help='fields of the model\'s config, e.g. \'{"pre_norm": false}\'')
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--batch_size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--warmup_steps", type=int, default=defaults.warmup_steps)
    parser.add_argument("--weight_decay", type=float, default=defaults.weight_decay)
    parser.add_argument("--grad_clip", type=float, default=defaults.grad_clip, help="0 for none")
    parser.add_argument("--eval_every", type=int, default=defaults.eval_every)
    parser.add_argument("--eval_size", type=int, default=defaults.eval_size)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--out", help="result JSON path; the learning curve goes to <out>.log, the checkpoint to "
                        "<out>.ckpt")
    parser.add_argument("--note", default="", help="a remark stored in the result and shown in the table")
    parser.add_argument("--table", nargs="+", metavar="JSON", help="print a markdown table of these results")
    parser.add_argument("--plot", metavar="PNG", help="with --table: also plot the learning curves to PNG")
    parser.add_argument("--update_page", metavar="MD", help="rebuild the generated tables and figures of this results "
                        "page from the run files under --runs")
    parser.add_argument("--runs", metavar="DIR", help="with --update_page: the folder of run files")
    parser.add_argument("--no_progress", action="store_true")
    args = parser.parse_args(argv)
    if args.plot and not args.table:
        parser.error("--plot needs --table")
    if bool(args.update_page) != bool(args.runs):
        parser.error("--update_page and --runs go together")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.update_page:
        page = Path(args.update_page)
        page.write_text(render_page(page.read_text(), args.runs, figures=page.parent))
        return
    if args.table:
        sys.stdout.write(results_table(args.table))
        if args.plot:
            plot_curves(args.table, args.plot)
        return
    not_config = ("out", "note", "table", "plot", "update_page", "runs", "no_progress")
    options = {k: v for k, v in vars(args).items() if k not in not_config}
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
        extra={"command": command, **({"note": args.note} if args.note else {})},
        checkpoint_path=f"{out}.ckpt" if out else None,
    )
    print(f"final validation accuracy {result['val_accuracy']:.4f}, test accuracy {result['test_accuracy']:.4f} "
          f"in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
