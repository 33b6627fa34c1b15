#!/usr/bin/env python
"""Sentence embeddings on real text (docs/results/sentence_embeddings.md): train Orchid or BERT of the same size
contrastively on passages of novels, then find each passage's chapter among the held-out novel's chapters:

    python scripts/sentence_embeddings.py train --model orchid --novels ../shared/data/austen/*.txt \\
        --held_out persuasion --vocab_dir ../shared/data/bert-base-uncased --output_dir outputs/embeddings/orchid
    python scripts/sentence_embeddings.py report --runs outputs/embeddings/orchid outputs/embeddings/bert \\
        --output docs/results/sentence_embeddings.md --command "..."

``train`` writes OUTPUT_DIR/results.json (losses, times, recall@1, recall@5 and MRR with the chapters whole and
truncated); ``report`` puts several runs in one Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ and experiments/ are not installed
from experiments.sentence_embeddings import MODEL_KINDS, report, run  # noqa: E402


def main(argv: list[str] | None = None) -> dict | str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="action", required=True)
    train = commands.add_parser("train", help="Train one model and evaluate it on the held-out novel.")
    train.add_argument("--model", choices=MODEL_KINDS, required=True)
    train.add_argument("--novels", nargs="+", required=True, help="Text files, one novel each.")
    train.add_argument("--held_out", required=True, help="The novel (file name, no .txt) to evaluate on.")
    train.add_argument("--vocab_dir", required=True, help="A folder with a WordPiece vocab.txt or a tokenizer.")
    train.add_argument("--output_dir", required=True)
    train.add_argument("--hidden_size", type=int, default=128)
    train.add_argument("--num_hidden_layers", type=int, default=2)
    train.add_argument("--num_attention_heads", type=int, default=2, help="BERT only.")
    train.add_argument("--steps", type=int, default=200)
    train.add_argument("--batch_size", type=int, default=32)
    train.add_argument("--learning_rate", type=float, default=1e-3)
    train.add_argument("--anchor_tokens", type=int, default=128, help="Anchor and query passage length.")
    train.add_argument("--positive_passages", type=int, default=4, help="Passages in a positive span.")
    train.add_argument("--pairs_per_chapter", type=int, default=4)
    train.add_argument("--queries_per_chapter", type=int, default=8)
    train.add_argument("--truncated_length", type=int, default=512)
    train.add_argument("--threads", type=int, default=1)
    train.add_argument("--seed", type=int, default=0)
    summary = commands.add_parser("report", help="One Markdown table of several runs.")
    summary.add_argument("--runs", nargs="+", required=True, help="Output folders of `train`.")
    summary.add_argument("--output", required=True)
    summary.add_argument("--command", required=True, help="The command that made the runs, for the report.")
    args = parser.parse_args(argv)

    if args.action == "report":
        results = [json.loads((Path(folder) / "results.json").read_text()) for folder in args.runs]
        table = report(results, args.command)
        Path(args.output).write_text(table)
        return table

    import torch
    from transformers import BertTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = BertTokenizer.from_pretrained(args.vocab_dir, do_lower_case=True)
    options = {key: getattr(args, key) for key in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "steps", "batch_size", "learning_rate",
        "anchor_tokens", "positive_passages", "pairs_per_chapter", "queries_per_chapter", "truncated_length", "seed",
    )}  # fmt: skip
    results = run(args.model, sorted(args.novels), args.held_out, tokenizer, args.output_dir, **options)
    print(json.dumps(results["evaluations"], indent=2))
    return results


if __name__ == "__main__":
    run_cli(main)
