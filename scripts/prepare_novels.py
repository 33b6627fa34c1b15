#!/usr/bin/env python
"""Data for the real-text comparison (docs/results/real_data.md) from novels and a WordPiece vocabulary:

    python scripts/prepare_novels.py --novels ../shared/data/austen/*.txt --held_out persuasion \\
        --vocab_dir ../shared/data/bert-base-uncased --passage_tokens 128 512 --pair_tokens 64 \\
        --output_dir outputs/austen

writes OUTPUT_DIR/tokenizer/ (a BertTokenizer folder, lower-cased), OUTPUT_DIR/mlm/{train,validation}.txt (one
paragraph per line; the held-out novel is the validation file) and two classification tasks, split by chapter: one
chapter in TEST_EVERY is a test chapter, and of the others one in VALIDATION_EVERY is a validation chapter.

- OUTPUT_DIR/attribution-N/ for each passage length N: passage-to-novel attribution (columns sentence, label).
- OUTPUT_DIR/pairs-2M/ for each --pair_tokens M: whether two passages of at most M tokens each come from the same
  novel (columns sentence1, sentence2, label; a pair fits 2M tokens), balanced labels.

Each folder has train.csv, validation.csv (validation chapters, for every choice), test.csv (test chapters, never
used for a choice), trainval.csv (training and validation chapters together) and counts.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ and experiments/ are not installed
from experiments.real_data.novels import (  # noqa: E402
    SPLITS,
    TRAINVAL,
    write_attribution_task,
    write_mlm_corpus,
    write_pair_task,
)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--novels", nargs="+", required=True, help="Text files, one novel each (file name: label).")
    parser.add_argument("--held_out", required=True, help="The novel (file name, no .txt) kept out of pretraining.")
    parser.add_argument("--vocab_dir", required=True, help="A folder with a WordPiece vocab.txt or a tokenizer.")
    parser.add_argument("--passage_tokens", type=int, nargs="+", default=[128], help="Attribution passage lengths.")
    parser.add_argument("--pair_tokens", type=int, nargs="*", default=[],
                        help="Passage lengths of the same-novel pair task (folder pairs-<twice the length>).")
    parser.add_argument("--test_every", type=int, default=5, help="One chapter in this many is a test chapter.")
    parser.add_argument("--validation_every", type=int, default=4,
                        help="One chapter in this many of the others is a validation chapter.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the pairs.")
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args(argv)

    from transformers import BertTokenizer

    out = Path(args.output_dir)
    tokenizer = BertTokenizer.from_pretrained(args.vocab_dir, do_lower_case=True)
    tokenizer.save_pretrained(out / "tokenizer")
    novels = sorted(args.novels)
    split = dict(test_every=args.test_every, validation_every=args.validation_every)
    summary = {"mlm": write_mlm_corpus(novels, args.held_out, out / "mlm")}
    for length in args.passage_tokens:
        counts = write_attribution_task(novels, tokenizer, length, out / f"attribution-{length}", **split)
        summary[f"attribution-{length}"] = {key: sum(counts[key].values()) for key in (*SPLITS, TRAINVAL)}
    for length in args.pair_tokens:
        counts = write_pair_task(novels, tokenizer, length, out / f"pairs-{2 * length}", **split, seed=args.seed)
        summary[f"pairs-{2 * length}"] = {key: sum(counts[key].values()) for key in (*SPLITS, TRAINVAL)}
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    run_cli(main)
