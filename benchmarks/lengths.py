"""What a sequence's length costs: Orchid mixes each sequence at the transform length that holds it, so a short batch in
a long-context model, and a workload of many lengths, pay for their own lengths.

    python scripts/lengths_benchmark.py --threads 1
    python scripts/lengths_benchmark.py --threads 2 --parts mixed

* ``short``: a batch of (8, 128) tokens through ``OrchidModel`` (``orchid-bert-base``'s width, ``--layers`` layers,
  default transform lengths) built with ``max_position_embeddings`` of 128, 512, 2048 and 8192, and through
  ``BertModel`` (SDPA) of the same sizes; forward times, interleaved, and each one's ratio to its 128-position time.
* ``mixed``: a workload of sequences whose lengths are drawn log-uniformly from 64 to 8192 (seeded), shuffled and
  batched as a DataLoader would (``--batch`` per batch, padded to the batch's longest), through ``OrchidModel`` and
  ``BertModel`` (SDPA) with 8192 positions: real tokens per second over the whole workload, and the peak tensor
  memory of its largest batch.

Forward passes in eval mode under ``torch.inference_mode()``, float32, random weights (seeded). JSON and markdown go
to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch

from benchmarks.measure import git_commit, interleaved_times, machine_info, profiled_peak_bytes, write_result

HIDDEN, HEADS, INTERMEDIATE, VOCAB = 768, 12, 3072, 30522
SHORT_POSITIONS = (128, 512, 2048, 8192)
SHORT_SHAPE = (8, 128)
MIXED_POSITIONS, MIXED_RANGE = 8192, (64, 8192)


def orchid_model(positions: int, layers: int):
    from orchid_hf import OrchidConfig, OrchidModel

    config = OrchidConfig.from_preset("orchid-bert-base", num_hidden_layers=layers, max_position_embeddings=positions)
    return OrchidModel(config).eval()


def bert_model(positions: int, layers: int):
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=HIDDEN, num_hidden_layers=layers, num_attention_heads=HEADS,
                        intermediate_size=INTERMEDIATE, max_position_embeddings=positions, attn_implementation="sdpa")
    return BertModel(config, add_pooling_layer=False).eval()


def forward(model, batch: dict[str, torch.Tensor]):
    """A closure that runs one forward of the batch and returns its seconds."""

    def call() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model(**batch)
        return time.perf_counter() - start

    return call


def mixed_workload(sequences: int, batch: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``sequences`` lengths drawn log-uniformly from MIXED_RANGE, shuffled, in batches of ``batch`` padded on the right
    to their longest; token ids random."""
    generator = torch.Generator().manual_seed(seed)
    low, high = (math.log(n) for n in MIXED_RANGE)
    lengths = torch.exp(low + (high - low) * torch.rand(sequences, generator=generator)).round().long().tolist()
    batches = []
    for start in range(0, sequences, batch):
        rows = lengths[start : start + batch]
        width = max(rows)
        mask = (torch.arange(width) < torch.tensor(rows).unsqueeze(1)).long()
        ids = torch.randint(1, VOCAB, (len(rows), width), generator=generator) * mask
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


def run_short(args) -> list[dict]:
    rows = []
    batch = {"input_ids": torch.randint(1, VOCAB, SHORT_SHAPE, generator=torch.Generator().manual_seed(0))}
    for name, build in (("Orchid", orchid_model), ("BERT (SDPA)", bert_model)):
        torch.manual_seed(0)
        calls = {positions: forward(build(positions, args.layers), batch) for positions in SHORT_POSITIONS}
        for call in calls.values():
            call()  # warm-up
        times = interleaved_times(calls, args.repeats, args.repeats, float("inf"))
        medians = {positions: statistics.median(values) for positions, values in times.items()}
        for positions, median in medians.items():
            rows.append(dict(part="short", model=name, positions=positions, median_s=median, times_s=times[positions],
                             ratio_to_128=median / medians[SHORT_POSITIONS[0]]))
    return rows


def run_mixed(args) -> list[dict]:
    workload = mixed_workload(args.sequences, args.batch)
    tokens = sum(int(b["attention_mask"].sum()) for b in workload)
    largest = max(workload, key=lambda b: b["input_ids"].numel())
    rows = []
    for name, build in (("Orchid", orchid_model), ("BERT (SDPA)", bert_model)):
        torch.manual_seed(0)
        model = build(MIXED_POSITIONS, args.layers)
        forward(model, largest)()  # warm-up

        def one_pass(model=model) -> float:
            return sum(forward(model, batch)() for batch in workload)

        passes = [one_pass() for _ in range(args.repeats)]
        median = statistics.median(passes)
        peak = profiled_peak_bytes(lambda model=model: forward(model, largest)())
        rows.append(dict(part="mixed", model=name, positions=MIXED_POSITIONS, median_s=median, times_s=passes,
                         tokens=tokens, tokens_per_s=tokens / median, peak_bytes=peak,
                         largest_batch=list(largest["input_ids"].shape)))
    orchid, bert = rows
    orchid["throughput_ratio"] = orchid["tokens_per_s"] / bert["tokens_per_s"]
    return rows


def markdown(result: dict) -> str:
    lines = [f"Command: `{result['command']}`; {result['machine']['torch_threads']} thread(s), commit "
             f"{result['commit']}.", ""]
    short = [r for r in result["rows"] if r["part"] == "short"]
    if short:
        lines += ["| model | positions | (8, 128) forward ms | time / time at 128 positions |", "|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['positions']:,} | {1e3 * r['median_s']:,.1f} | {r['ratio_to_128']:.2f}x |"
                  for r in short]
        lines.append("")
    mixed = [r for r in result["rows"] if r["part"] == "mixed"]
    if mixed:
        lines += ["| model | workload s | real tokens / s | peak MiB (largest batch) |", "|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['median_s']:,.1f} | {r['tokens_per_s']:,.0f} | {r['peak_bytes'] / 2**20:,.0f} |"
                  for r in mixed]
        lines += ["", f"Orchid's throughput over BERT's: {mixed[0]['throughput_ratio']:.2f}x "
                  f"({mixed[0]['tokens']:,} real tokens; largest batch {tuple(mixed[0]['largest_batch'])})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="short,mixed", help="comma-separated: short, mixed")
    parser.add_argument("--layers", type=int, default=2, help="layers of both models (default 2)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--sequences", type=int, default=24, help="sequences in the mixed workload (default 24)")
    parser.add_argument("--batch", type=int, default=4, help="its batch size (default 4)")
    parser.add_argument("--out-dir", default="outputs/bench")
    parser.add_argument("--tag", default=None)
    args = parser.parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = sorted(set(parts) - {"short", "mixed"})
    if unknown or not parts:
        parser.error(f"--parts takes short and mixed, got {args.parts!r}")
    for name in ("layers", "threads", "repeats", "sequences", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    result = {
        "command": "python scripts/lengths_benchmark.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": git_commit(),
        "machine": machine_info(args.threads),
        "rows": (run_short(args) if "short" in parts else []) + (run_mixed(args) if "mixed" in parts else []),
    }
    write_result(result, args.out_dir, "lengths" + (f"_{args.tag}" if args.tag else ""), markdown)
    return result
