"""A training step of small models, Orchid against transformers' model of the same size, where fixed costs per call
(many small ops, transforms of short sequences) weigh most:

    python scripts/small_step.py --threads 1
    python scripts/small_step.py --threads 2 --reference ../orchid-old   # also another version's model code

* ``image``: ``OrchidForImageClassification`` against ``ViTForImageClassification`` (patch 2, hidden 64, 2 layers,
  4 heads, intermediate 256, 10 classes), 64 images of 8 x 8 with 3 channels;
* ``text``: ``OrchidForMaskedLM`` against ``BertForMaskedLM`` (hidden 64, 2 layers, 4 heads, intermediate 256,
  vocabulary 1000), batch (8, 128) with 15% of the positions labelled.

Each step is a forward of the model's own loss, its backward and a fused AdamW step (Trainer's default), without
dropout; the candidates of a
task are timed in interleaved rounds (medians reported) after warm-up steps. A JSON and a markdown table are written
to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.candidates import load_modeling, mlm_batch
from benchmarks.harness import (
    check_at_least,
    commit_text,
    interleaved_times,
    provenance,
    table_lines,
    timed_call,
    write_result,
)

HIDDEN, LAYERS, HEADS, INTERMEDIATE = 64, 2, 4, 256
IMAGE_BATCH, IMAGE_SIZE, PATCH, CHANNELS, CLASSES = 64, 8, 2, 3, 10
TEXT_BATCH, TEXT_LENGTH, VOCAB = 8, 128, 1000


def orchid_image(package):
    config = package.OrchidConfig.from_preset(
        "orchid-vit-cifar-s", image_size=IMAGE_SIZE, patch_size=PATCH, num_channels=CHANNELS, hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS, num_labels=CLASSES,
    )
    return package.OrchidForImageClassification(config)


def vit_image(package=None):
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=IMAGE_SIZE, patch_size=PATCH, num_channels=CHANNELS, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=INTERMEDIATE, num_labels=CLASSES, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return ViTForImageClassification(config)


def orchid_text(package):
    config = package.OrchidConfig.from_preset(
        "orchid-bert-base", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        intermediate_size=INTERMEDIATE, max_position_embeddings=TEXT_LENGTH, hidden_dropout_prob=0.0,
    )
    return package.OrchidForMaskedLM(config)


def bert_text(package=None):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE, max_position_embeddings=TEXT_LENGTH, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="sdpa",
    )
    return BertForMaskedLM(config)


# task -> (the Orchid builder, the baseline's name, its builder)
TASKS = {
    "image": (orchid_image, "ViTForImageClassification", vit_image),
    "text": (orchid_text, "BertForMaskedLM (SDPA)", bert_text),
}


def batch_of(task: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    if task == "image":
        return {
            "pixel_values": torch.randn(IMAGE_BATCH, CHANNELS, IMAGE_SIZE, IMAGE_SIZE, generator=generator),
            "labels": torch.randint(0, CLASSES, (IMAGE_BATCH,), generator=generator),
        }
    input_ids, labels = mlm_batch(VOCAB, TEXT_BATCH, TEXT_LENGTH)
    return {"input_ids": input_ids, "labels": labels}


def training_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    """A closure that runs one step (forward of the loss, backward, AdamW). AdamW is fused, as Trainer's default
    optimizer (``adamw_torch_fused``) is."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def run(args: argparse.Namespace) -> dict:
    import orchid_hf

    torch.set_num_threads(args.threads)
    reference = load_modeling(args.reference) if args.reference else None
    rows = []
    for task, (orchid, baseline_name, baseline) in TASKS.items():
        torch.manual_seed(0)
        builders = {"Orchid": lambda orchid=orchid: orchid(orchid_hf), baseline_name: baseline}
        if reference is not None:
            builders["Orchid, reference version"] = lambda orchid=orchid: orchid(reference)
        batch = batch_of(task)
        steps = {name: training_step(build(), batch) for name, build in builders.items()}
        for step in steps.values():
            for _ in range(args.warmup):
                step()
        timed = {name: (lambda step=step: timed_call(step)) for name, step in steps.items()}
        times = interleaved_times(timed, args.repeats, args.repeats, budget_s=float("inf"))
        medians = {name: statistics.median(values) for name, values in times.items()}
        for name, median in medians.items():
            rows.append(dict(task=task, model=name, median_s=median, times_s=times[name],
                             speed_up=medians[baseline_name] / median))
    return {
        "command": "python scripts/small_step.py " + " ".join(args.argv),
        "started": args.started,
        **provenance(args.threads),
        "rows": rows,
    }


def markdown(result: dict) -> str:
    rows = [[row["task"], row["model"], f"{1e3 * row['median_s']:,.1f}", f"{row['speed_up']:.2f}x"]
            for row in result["rows"]]
    lines = [
        f"Command: `{result['command']}`; {result['machine']['torch_threads']} thread(s), {commit_text(result)}.",
        "",
        *table_lines(["task", "model", "step ms (median)", "speed-up over the baseline"], rows),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    import sys

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds (default 15)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each model first (default 3)")
    parser.add_argument("--reference", default=None, metavar="PATH",
                        help="another version's model code (a checkout holding modeling/, or that folder)")
    parser.add_argument("--out-dir", default="outputs/bench")
    parser.add_argument("--tag", default=None)
    args = parser.parse_args(argv)
    check_at_least(parser, args, "--threads", "--repeats")
    args.argv = sys.argv[1:] if argv is None else argv
    args.started = time.strftime("%Y-%m-%d %H:%M:%S")
    result = run(args)
    write_result(result, args.out_dir, "small_step" + (f"_{args.tag}" if args.tag else ""), markdown)
    return result
