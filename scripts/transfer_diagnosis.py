#!/usr/bin/env python
"""Why pretrained Orchid transfers worse than pretrained BERT to novel attribution: the diagnosis of
docs/results/real_data.md on small models (experiments/transfer/), one thread.

    python scripts/transfer_diagnosis.py prepare
    python scripts/transfer_diagnosis.py probe orchid-random-s0 orchid-pt300-s0 bert-random-s0 bert-pt300-s0
    python scripts/transfer_diagnosis.py operator orchid-random-s0 orchid-pt300-s0
    python scripts/transfer_diagnosis.py finetune orchid-pt300-s0 --epochs 1 3 --lr 5e-5 2e-4 --pooling first mean
    python scripts/transfer_diagnosis.py table
    python scripts/transfer_diagnosis.py filters outputs/real_data/pretrain-orchid   # saved Orchid models' filters
                                                     # (docs/results/transfer/filters-FOLDER.json)

Model names: ARCH-random-sSEED or ARCH-ptSTEPS[-dropoutP][-prenorm]-sSEED (masked-LM pretraining on the non-test
chapters, cached under --work_dir). Results: one JSON per run in docs/results/transfer/.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # experiments/ is not installed

import torch  # noqa: E402

from experiments.transfer import diagnose, report  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = ["prepare", "pretrain", "probe", "operator", "finetune", "bow", "table", "filters"]
    parser.add_argument("command", choices=commands)
    parser.add_argument("models", nargs="*")
    # ../shared/data beside the checkout, as scripts/real_data.sh reads it.
    parser.add_argument("--data_dir", default=str(ROOT.parent / "shared/data/austen"))
    parser.add_argument("--vocab_dir", default=str(ROOT.parent / "shared/data/bert-base-uncased"))
    parser.add_argument("--work_dir", default=str(ROOT / "outputs/transfer"))
    parser.add_argument("--results_dir", default=str(ROOT / "docs/results/transfer"))
    parser.add_argument("--epochs", type=int, nargs="+", default=[1])
    parser.add_argument("--lr", type=float, nargs="+", default=[2e-4])
    parser.add_argument("--pooling", nargs="+", default=["first"], choices=["first", "mean"])
    parser.add_argument("--pooler_init", nargs="+", default=["random"], choices=["random", "mlm"])
    parser.add_argument("--finetune_seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.command == "table":
        print(report.table(Path(args.results_dir)))
        return
    if args.command == "filters":
        records = [diagnose.filter_record(folder) for folder in args.models]
        for record in records:
            diagnose.write_result(args.results_dir, f"filters-{record['model']}", record)
        print(diagnose.filter_table(records))
        return
    ws = diagnose.Workspace(args.data_dir, args.vocab_dir, args.work_dir, args.results_dir)
    if args.command == "bow":
        print(diagnose.run_bag_of_words(ws))
    for name in args.models:
        if args.command == "pretrain":
            ws.mlm_model(name)
        elif args.command == "probe":
            result = diagnose.run_probe(ws, name)
            print(name, {k: [round(a, 3) for a in v] for k, v in result["layers"].items()}, flush=True)
        elif args.command == "operator":
            print(diagnose.run_operator(ws, name), flush=True)
        elif args.command == "finetune":
            for pooling in args.pooling:
                for pooler_init in args.pooler_init:
                    for epochs in args.epochs:
                        for lr in args.lr:
                            for seed in args.finetune_seeds:
                                result = diagnose.run_finetune(ws, name, epochs, lr, pooling, seed, pooler_init)
                                print(name, pooling, pooler_init, epochs, lr, seed, result["history"],
                                      f"{result['train_seconds']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
