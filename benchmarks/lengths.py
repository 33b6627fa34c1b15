"""What a sequence's length costs: Orchid mixes each sequence at the transform length that holds it, and runs its
per-token layers on the real tokens only, so a short batch in a long-context model, a workload of many lengths and a
fine-tuning epoch with padding pay for their own tokens.

    python scripts/lengths_benchmark.py --threads 1
    python scripts/lengths_benchmark.py --threads 2 --parts mixed --reference ../other-checkout
    python scripts/lengths_benchmark.py --threads 1 --parts finetune --text-file ../shared/data/austen/persuasion.txt \
        --tokenizer ../shared/data/bert-base-uncased

* ``short``: a batch of (8, 128) tokens through ``OrchidModel`` (``orchid-bert-base``'s width, ``--layers`` layers,
  default transform lengths) built with ``max_position_embeddings`` of 128, 512, 2048 and 8192, and through
  ``BertModel`` (SDPA) of the same sizes; forward times, interleaved, and each one's ratio to its 128-position time.
* ``mixed``: a workload of sequences whose lengths are drawn log-uniformly from 64 to 8192 (seeded), shuffled and
  batched as a DataLoader would (``--batch`` per batch), through ``OrchidModel`` and ``BertModel`` (SDPA) with 8192
  positions: padded to each batch's longest (as ``DataCollatorWithPadding`` gives them), packed in one row per batch
  (as ``DataCollatorWithFlattening`` gives them; Orchid only), and one sequence a call (full rows, no padding at all);
  with ``--reference``, also another version of the model code on the padded batches. Real tokens per second over the
  whole workload, and the peak tensor memory of its largest batch.
* ``mixed-profile``: where Orchid's padded batches of that workload spend their time beyond the same sequences one a
  call, op by op (torch.profiler's self CPU time over one pass each way).
* ``finetune``: one epoch of masked-LM fine-tuning (30% masking, AdamW) on the paragraphs of ``--text-file`` (a novel
  in Project Gutenberg's layout, each paragraph one sequence of at most ``--max-length`` tokens, ``--batch`` a step),
  with dynamic padding for Orchid and BERT (SDPA) and packed batches for Orchid; ``--fine-tune-size`` the models'
  width and depth. Real tokens per second of training.

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

from benchmarks.harness import (
    check_at_least,
    commit_text,
    interleaved_times,
    peak_bytes,
    provenance,
    table_lines,
    timed_call,
    write_result,
)

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
    """A closure that runs one forward of the batch."""

    def call() -> None:
        with torch.inference_mode():
            model(**batch)

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
        timed = {positions: (lambda call=call: timed_call(call)) for positions, call in calls.items()}
        times = interleaved_times(timed, args.repeats, args.repeats, float("inf"))
        medians = {positions: statistics.median(values) for positions, values in times.items()}
        for positions, median in medians.items():
            rows.append(dict(part="short", model=name, positions=positions, median_s=median, times_s=times[positions],
                             ratio_to_128=median / medians[SHORT_POSITIONS[0]]))
    return rows


def packed(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A padded batch's sequences packed in one row, with position_ids restarting at each (DataCollatorWithFlattening's
    form)."""
    lengths = batch["attention_mask"].sum(1).tolist()
    return {"input_ids": batch["input_ids"][batch["attention_mask"].bool()].unsqueeze(0),
            "position_ids": torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)}  # fmt: skip


def one_by_one(batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Each sequence of a padded batch alone, without padding."""
    return [{"input_ids": ids[mask.bool()].unsqueeze(0)} for ids, mask in zip(batch["input_ids"],
                                                                            batch["attention_mask"])]  # fmt: skip


def reference_model(path: str, positions: int, layers: int):
    """``OrchidModel`` of another version of the model code (``--reference``), at this benchmark's sizes."""
    from benchmarks.candidates import load_modeling

    reference = load_modeling(path)
    config = reference.OrchidConfig.from_preset("orchid-bert-base", num_hidden_layers=layers,
                                                max_position_embeddings=positions)  # fmt: skip
    return reference.OrchidModel(config).eval()


def run_mixed(args) -> list[dict]:
    workload = mixed_workload(args.sequences, args.batch)
    tokens = sum(int(b["attention_mask"].sum()) for b in workload)
    largest = max(workload, key=lambda b: b["input_ids"].numel())
    candidates = [
        ("Orchid, padded", lambda: orchid_model(MIXED_POSITIONS, args.layers), workload, largest),
        ("Orchid, packed", lambda: orchid_model(MIXED_POSITIONS, args.layers), [packed(b) for b in workload],
         packed(largest)),
        ("Orchid, one sequence a call", lambda: orchid_model(MIXED_POSITIONS, args.layers),
         [single for b in workload for single in one_by_one(b)], one_by_one(largest)[0]),
        ("BERT (SDPA), padded", lambda: bert_model(MIXED_POSITIONS, args.layers), workload, largest),
    ]  # fmt: skip
    if args.reference:
        candidates.insert(1, (f"Orchid at {args.reference_name}, padded",
                              lambda: reference_model(args.reference, MIXED_POSITIONS, args.layers), workload, largest))
    rows = []
    for name, build, batches, biggest in candidates:
        torch.manual_seed(0)
        model = build()
        forward(model, biggest)()  # warm-up

        def one_pass(model=model, batches=batches) -> float:
            return sum(timed_call(forward(model, batch)) for batch in batches)

        passes = [one_pass() for _ in range(args.repeats)]
        median = statistics.median(passes)
        rows.append(dict(part="mixed", model=name, positions=MIXED_POSITIONS, median_s=median, times_s=passes,
                         tokens=tokens, tokens_per_s=tokens / median, peak_bytes=peak_bytes(forward(model, biggest)),
                         largest_batch=list(biggest["input_ids"].shape)))  # fmt: skip
    by_name = {row["model"]: row for row in rows}
    for row in rows:
        row["throughput_to_bert"] = row["tokens_per_s"] / by_name["BERT (SDPA), padded"]["tokens_per_s"]
        row["throughput_to_full_rows"] = row["tokens_per_s"] / by_name["Orchid, one sequence a call"]["tokens_per_s"]
    return rows


def run_mixed_profile(args, ops: int = 12) -> list[dict]:
    """Where the padded batches of the mixed workload spend their time beyond the same sequences one a call: each op's
    self CPU time over one pass of the workload both ways (torch.profiler, after a warm-up pass), the ops whose times
    differ most first, and the totals."""
    from benchmarks.profiles import op_times

    workload = mixed_workload(args.sequences, args.batch)
    torch.manual_seed(0)
    model = orchid_model(MIXED_POSITIONS, args.layers)
    ways = {"padded": workload, "single": [single for batch in workload for single in one_by_one(batch)]}
    times = {}
    for name, batches in ways.items():
        times[name], times[f"{name}_wall"] = op_times(lambda batches=batches: [forward(model, b)() for b in batches], 1)
    names = sorted(set(times["padded"]) | set(times["single"]),
                   key=lambda op: times["single"].get(op, 0.0) - times["padded"].get(op, 0.0))  # fmt: skip
    rows = [dict(part="mixed_profile", op=op, padded_ms=times["padded"].get(op, 0.0),
                 single_ms=times["single"].get(op, 0.0)) for op in names[:ops]]  # fmt: skip
    rows.append(dict(part="mixed_profile", op="total (wall)", padded_ms=times["padded_wall"],
                     single_ms=times["single_wall"]))  # fmt: skip
    return rows


def finetune_data(args, tokenizer) -> list[list[int]]:
    """The paragraphs of ``--text-file``, tokenized (``[CLS] ... [SEP]``, at most ``--max-length`` tokens each)."""
    from experiments.real_data.novels import read_novel

    paragraphs = [paragraph for chapter in read_novel(args.text_file) for paragraph in chapter]
    encoded = tokenizer(paragraphs, truncation=True, max_length=args.max_length)["input_ids"]
    return encoded[: args.paragraphs] if args.paragraphs else encoded


def run_finetune(args) -> list[dict]:
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertTokenizer,
        DataCollatorForLanguageModeling,
        DataCollatorWithFlattening,
    )

    from orchid_hf import OrchidConfig, OrchidForMaskedLM

    tokenizer = BertTokenizer.from_pretrained(args.tokenizer, do_lower_case=True)
    sequences = finetune_data(args, tokenizer)
    hidden, layers = args.fine_tune_size
    masking = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3)
    flatten = DataCollatorWithFlattening()

    def padded_batches() -> list[dict]:
        generator = torch.Generator().manual_seed(0)
        masking.generator = generator
        return [masking([{"input_ids": ids} for ids in sequences[i : i + args.batch]])
                for i in range(0, len(sequences), args.batch)]  # fmt: skip

    def packed_batches() -> list[dict]:
        batches = []
        for batch in padded_batches():  # the same masks, packed
            real = batch["attention_mask"].bool()
            flat = flatten([{"input_ids": ids[mask].tolist()} for ids, mask in zip(batch["input_ids"], real)])
            batches.append({"input_ids": flat["input_ids"], "position_ids": flat["position_ids"],
                            "labels": batch["labels"][real].unsqueeze(0)})  # fmt: skip
        return batches

    def orchid():
        config = OrchidConfig.from_preset("orchid-bert-base", vocab_size=len(tokenizer), hidden_size=hidden,
                                          num_hidden_layers=layers, intermediate_size=4 * hidden,
                                          max_position_embeddings=args.max_length)  # fmt: skip
        return OrchidForMaskedLM(config)

    def bert():
        config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=max(hidden // 64, 1),
                            intermediate_size=4 * hidden, max_position_embeddings=args.max_length,
                            attn_implementation="sdpa")  # fmt: skip
        return BertForMaskedLM(config)

    tokens = sum(map(len, sequences))
    rows = []
    for name, build, batches in (("Orchid, dynamic padding", orchid, padded_batches()),
                                 ("Orchid, packed", orchid, packed_batches()),
                                 ("BERT (SDPA), dynamic padding", bert, padded_batches())):  # fmt: skip
        torch.manual_seed(0)
        model = build().train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(batch, model=model, optimizer=optimizer) -> float:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss.item()

        step(batches[0])  # warm-up
        start = time.perf_counter()
        losses = [step(batch) for batch in batches]
        seconds = time.perf_counter() - start
        rows.append(dict(part="finetune", model=name, seconds=seconds, tokens=tokens, tokens_per_s=tokens / seconds,
                         steps=len(batches), mean_loss=statistics.mean(losses),
                         padded_tokens=sum(b["input_ids"].numel() for b in batches)))  # fmt: skip
    bert_speed = rows[-1]["tokens_per_s"]
    for row in rows:
        row["throughput_to_bert"] = row["tokens_per_s"] / bert_speed
    return rows


def markdown(result: dict) -> str:
    lines = [f"Command: `{result['command']}`; {result['machine']['torch_threads']} thread(s), "
             f"{commit_text(result)}.", ""]
    short = [r for r in result["rows"] if r["part"] == "short"]
    if short:
        header = ["model", "positions", "(8, 128) forward ms", "time / time at 128 positions"]
        lines += table_lines(header, [[r["model"], f"{r['positions']:,}", f"{1e3 * r['median_s']:,.1f}",
                                       f"{r['ratio_to_128']:.2f}x"] for r in short])  # fmt: skip
        lines.append("")
    mixed = [r for r in result["rows"] if r["part"] == "mixed"]
    if mixed:
        header = ["model, batches", "workload s", "real tokens / s", "/ BERT padded", "/ Orchid one sequence a call",
                  "peak MiB (largest batch)"]  # fmt: skip
        lines += table_lines(header, [[r["model"], f"{r['median_s']:,.1f}", f"{r['tokens_per_s']:,.0f}",
                                       f"{r['throughput_to_bert']:.2f}x", f"{r['throughput_to_full_rows']:.2f}x",
                                       f"{r['peak_bytes'] / 2**20:,.0f}"] for r in mixed])  # fmt: skip
        lines += ["", f"{mixed[0]['tokens']:,} real tokens; largest padded batch {tuple(mixed[0]['largest_batch'])}."]
        lines.append("")
    profile = [r for r in result["rows"] if r["part"] == "mixed_profile"]
    if profile:
        header = ["op", "padded batches ms", "one sequence a call ms", "difference ms"]
        lines += table_lines(header, [[r["op"], f"{r['padded_ms']:,.1f}", f"{r['single_ms']:,.1f}",
                                       f"{r['padded_ms'] - r['single_ms']:+,.1f}"] for r in profile])  # fmt: skip
        lines.append("")
    finetune = [r for r in result["rows"] if r["part"] == "finetune"]
    if finetune:
        header = ["model, batches", "epoch s", "real tokens / s", "/ BERT", "steps", "positions in the batches"]
        lines += table_lines(header, [[r["model"], f"{r['seconds']:,.1f}", f"{r['tokens_per_s']:,.0f}",
                                       f"{r['throughput_to_bert']:.2f}x", str(r["steps"]), f"{r['padded_tokens']:,}"]
                                      for r in finetune])  # fmt: skip
        lines += ["", f"{finetune[0]['tokens']:,} real tokens in the epoch."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="short,mixed",
                        help="comma-separated: short, mixed, mixed-profile, finetune")
    parser.add_argument("--layers", type=int, default=2, help="layers of both models (default 2)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--sequences", type=int, default=24, help="sequences in the mixed workload (default 24)")
    parser.add_argument("--batch", type=int, default=4, help="its batch size (default 4)")
    parser.add_argument("--reference", default=None, metavar="PATH",
                        help="another version's model code (a checkout or its modeling/ folder), timed on the padded "
                             "batches of the mixed workload")  # fmt: skip
    parser.add_argument("--reference-name", default="the reference", help="its name in the tables")
    parser.add_argument("--text-file", default=None, help="finetune: a novel in Project Gutenberg's layout")
    parser.add_argument("--tokenizer", default=None, help="finetune: a folder with a WordPiece vocab.txt")
    parser.add_argument("--max-length", type=int, default=512, help="finetune: tokens per paragraph at most")
    parser.add_argument("--paragraphs", type=int, default=0, help="finetune: the first this many (0: all)")
    parser.add_argument("--fine-tune-size", type=int, nargs=2, default=(256, 4), metavar=("HIDDEN", "LAYERS"))
    parser.add_argument("--out-dir", default="outputs/bench")
    parser.add_argument("--tag", default=None)
    args = parser.parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = sorted(set(parts) - {"short", "mixed", "mixed-profile", "finetune"})
    if unknown or not parts:
        parser.error(f"--parts takes short, mixed, mixed-profile and finetune, got {args.parts!r}")
    if "finetune" in parts and not (args.text_file and args.tokenizer):
        parser.error("--parts finetune needs --text-file and --tokenizer")
    check_at_least(parser, args, "--layers", "--threads", "--repeats", "--sequences", "--batch", "--max-length")
    torch.set_num_threads(args.threads)
    result = {
        "command": "python scripts/lengths_benchmark.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        **provenance(args.threads),
        "rows": (run_short(args) if "short" in parts else []) + (run_mixed(args) if "mixed" in parts else [])
        + (run_mixed_profile(args) if "mixed-profile" in parts else [])
        + (run_finetune(args) if "finetune" in parts else []),
    }
    write_result(result, args.out_dir, "lengths" + (f"_{args.tag}" if args.tag else ""), markdown)
    return result
