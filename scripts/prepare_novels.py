#!/usr/bin/env python
"""Data for the real-text comparison (docs/results/real_data.md) from novels and a WordPiece vocabulary:

    python scripts/prepare_novels.py --novels ../shared/data/austen/*.txt --held_out persuasion \\
        --vocab_dir ../shared/data/bert-base-uncased --passage_tokens 128 512 --output_dir outputs/austen

writes OUTPUT_DIR/tokenizer/ (a BertTokenizer folder, lower-cased), OUTPUT_DIR/mlm/{train,validation}.txt (one
paragraph per line; the held-out novel is the validation file) and, for each passage length N,
OUTPUT_DIR/attribution-N/{train,validation}.csv (passage-to-novel attribution, split by chapter) with counts.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ and experiments/ are not installed
from experiments.real_data.novels import write_attribution_task, write_mlm_corpus  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--novels", nargs="+", required=True, help="Text files, one novel each (file name: label).")
    parser.add_argument("--held_out", required=True, help="The novel (file name, no .txt) kept out of pretraining.")
    parser.add_argument("--vocab_dir", required=True, help="A folder with a WordPiece vocab.txt or a tokenizer.")
    parser.add_argument("--passage_tokens", type=int, nargs="+", default=[128], help="Attribution passage lengths.")
    parser.add_argument("--test_every", type=int, default=5, help="One chapter in this many is a test chapter.")
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args(argv)

    from transformers import BertTokenizer

    out = Path(args.output_dir)
    tokenizer = BertTokenizer.from_pretrained(args.vocab_dir, do_lower_case=True)
    tokenizer.save_pretrained(out / "tokenizer")
    summary = {"mlm": write_mlm_corpus(sorted(args.novels), args.held_out, out / "mlm")}
    for length in args.passage_tokens:
        counts = write_attribution_task(sorted(args.novels), tokenizer, length, out / f"attribution-{length}",
                                        test_every=args.test_every)  # fmt: skip
        summary[f"attribution-{length}"] = {split: sum(counts[split].values()) for split in ("train", "validation")}
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    run_cli(main)
