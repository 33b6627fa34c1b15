"""One training step of a 12-layer Orchid model at one long sequence: does it fit, how much memory, how long.

    python scripts/long_step.py --head sequence-classification --length 65536 --checkpointing
    python scripts/long_step.py --head masked-lm --length 16384

The model is ``orchid-bert-base`` with ``max_position_embeddings`` = the length (the transform length), without
dropout; the step is a forward, a backward of the head's loss and an AdamW step, on random token ids. What is
reported: the peak resident set size of the step above the process's size before it (the model, its gradients and
the optimizer state are there before, after one warm-up step at a short length), the time of the step, and the loss.
A JSON file with the commit, the machine and its versions is written beside the printed line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.candidates import mlm_batch
from benchmarks.harness import check_at_least, provenance, rss_peak_bytes, timed_call, write_json

HEADS = ("masked-lm", "sequence-classification")


def build(head: str, length: int, layers: int, checkpointing: bool) -> torch.nn.Module:
    from orchid_hf import OrchidConfig, OrchidForMaskedLM, OrchidForSequenceClassification

    config = OrchidConfig.from_preset(
        "orchid-bert-base", max_position_embeddings=length, num_hidden_layers=layers, hidden_dropout_prob=0.0
    )
    model = OrchidForMaskedLM(config) if head == "masked-lm" else OrchidForSequenceClassification(config)
    if checkpointing:
        model.activation_checkpointing_enable()
    return model.train()


def step(model, optimizer, head: str, length: int) -> float:
    input_ids, labels = mlm_batch(model.config.vocab_size, 1, length)
    if head == "sequence-classification":
        labels = torch.tensor([1])
    loss = model(input_ids=input_ids, labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", choices=HEADS, default="masked-lm")
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing, one layer at a time")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", default="outputs/bench")
    args = parser.parse_args(argv)
    check_at_least(parser, args, "--length", "--layers", "--threads")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build(args.head, args.length, args.layers, args.checkpointing)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    step(model, optimizer, args.head, min(args.length, 128))  # allocates the gradients and the optimizer state
    result = {}

    def timed_step() -> None:
        result["seconds"] = timed_call(lambda: result.update(loss=step(model, optimizer, args.head, args.length)))

    result["rss_peak_bytes"] = rss_peak_bytes(timed_step)
    result.update(head=args.head, length=args.length, layers=args.layers, checkpointing=args.checkpointing,
                  parameters=sum(p.numel() for p in model.parameters()), **provenance(args.threads))
    tag = f"{args.head}_{args.length}{'_checkpointing' if args.checkpointing else ''}"
    write_json(Path(args.out_dir) / f"long_step_{tag}.json", result)
    print(f"{args.head} at (1, {args.length}), {args.layers} layers, checkpointing {args.checkpointing}: "
          f"step {result['seconds']:.1f} s, peak RSS above the model and optimizer state "
          f"{result['rss_peak_bytes'] / 2**30:.2f} GiB, loss {result['loss']:.3f}", flush=True)
    return result
