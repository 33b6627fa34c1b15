"""Dynamic int8 quantisation in ONNX Runtime (``orchid_hf.onnx.quantize_int8``) on a real task: the masked-LM accuracy
on held-out text and the time of reading it, for a masked LM in PyTorch, its float32 ONNX graph and its int8 graph.
Orchid is exported with ``export_onnx``, BERT with transformers' ``OnnxExporter``; both are quantised the same way.

The task is the long-context evaluation's (``experiments/real_data/long_context.py``): the text's documents as one
token stream, 30% of its tokens masked once by BERT's rule with ``--seed``, read in blocks of ``--length`` tokens
(``[CLS]``, text, ``[SEP]``), ``--tokens-per-batch`` tokens a call; every runtime reads the same masked blocks.

    python scripts/int8_benchmark.py --models outputs/ablation/o128 outputs/real_data/ctx-bert-128 \\
        --validation_file outputs/real_data/austen/mlm/validation.txt --threads 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from benchmarks.harness import check_at_least, provenance, table_lines, write_result


class OnnxMaskedLM:
    """An ONNX Runtime session called as a masked LM is (``model(input_ids=..., attention_mask=...).logits``), as
    ``experiments.real_data.long_context.predict`` calls it."""

    def __init__(self, path: Path, threads: int):
        from orchid_hf.onnx import onnxruntime_session

        self.session = onnxruntime_session(path, threads=threads)
        self.inputs = [value.name for value in self.session.get_inputs()]

    def eval(self):
        return self

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        feed = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": torch.zeros_like(input_ids)}
        arrays = {name: feed[name].numpy() for name in self.inputs}
        return SimpleNamespace(logits=torch.from_numpy(self.session.run(None, arrays)[0]))


def export(model, folder: Path) -> Path:
    """The float32 ONNX graph of ``model``: ``export_onnx`` for Orchid, transformers' ``OnnxExporter`` (dynamic
    shapes) for another model."""
    from orchid_hf import OrchidPreTrainedModel
    from orchid_hf.onnx import export_onnx

    if isinstance(model, OrchidPreTrainedModel):
        return export_onnx(model, folder / "model.onnx")
    from transformers.exporters import OnnxConfig, OnnxExporter

    sample = {"input_ids": torch.randint(5, 100, (2, 16)), "attention_mask": torch.ones(2, 16, dtype=torch.long)}
    OnnxExporter().export(model, sample, config=OnnxConfig(dynamic=True)).save_pretrained(folder)
    return folder / "model.onnx"


def graph_bytes(path: Path) -> int:
    """The bytes of an ONNX file and of the external data beside it (``NAME.onnx.data``, as transformers' exporter
    writes the weights)."""
    return sum(file.stat().st_size for file in path.parent.iterdir()
               if file.name == path.name or file.name.startswith(path.name + "."))  # fmt: skip


def masked_text(tokenizer, validation_file: str, seed: int, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The held-out stream, cut to ``max_tokens`` (0: all), masked once: ``(inputs, labels)``."""
    from experiments.real_data.long_context import MLM_PROBABILITY, mask_stream, token_stream

    lines = Path(validation_file).read_text(encoding="utf-8").splitlines()
    stream = token_stream(tokenizer, lines)
    stream = stream[:max_tokens] if max_tokens else stream
    return mask_stream(stream, tokenizer.all_special_ids, len(tokenizer), tokenizer.mask_token_id, MLM_PROBABILITY,
                       seed)  # fmt: skip


def score(model, inputs, labels, length: int, special: dict, tokens_per_batch: int) -> dict:
    """Accuracy and mean cross-entropy of the masked tokens, and the seconds of reading the whole text."""
    from experiments.real_data.long_context import predict

    started = time.perf_counter()
    predictions, losses = predict(model, inputs, labels, length, special, tokens_per_batch)
    seconds = time.perf_counter() - started
    scored = labels != -100
    return {"accuracy": float((predictions[scored] == labels[scored]).mean()), "loss": float(np.mean(losses[scored])),
            "seconds": seconds, "tokens": len(inputs), "masked_tokens": int(scored.sum()),
            "tokens_per_s": len(inputs) / seconds}  # fmt: skip


def run_model(folder: str, args) -> list[dict]:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    import orchid_hf  # noqa: F401  (registers Orchid with the Auto classes)
    from orchid_hf.onnx import quantize_int8

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or folder)
    model = AutoModelForMaskedLM.from_pretrained(folder).eval()
    inputs, labels = masked_text(tokenizer, args.validation_file, args.seed, args.max_tokens)
    special = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id, "pad": tokenizer.pad_token_id}
    rows = []
    with tempfile.TemporaryDirectory(prefix="int8-") as work:
        path = export(model, Path(work))
        quantized = quantize_int8(path)
        runtimes = [("PyTorch", model, None), ("ONNX Runtime, float32", OnnxMaskedLM(path, args.threads), path),
                    ("ONNX Runtime, int8", OnnxMaskedLM(quantized, args.threads), quantized)]  # fmt: skip
        for name, runner, file in runtimes:
            rows.append({"model": folder, "model_type": model.config.model_type, "runtime": name,
                         "file_mib": None if file is None else graph_bytes(file) / 2**20,
                         **score(runner, inputs, labels, args.length, special, args.tokens_per_batch)})  # fmt: skip
    base = rows[0]
    for row in rows:
        row["accuracy_change"] = row["accuracy"] - base["accuracy"]
        row["speed_to_pytorch"] = base["seconds"] / row["seconds"]
    return rows


def markdown(result: dict) -> str:
    header = ("model", "runtime", "masked-token accuracy %", "change, points", "loss", "tokens / s",
              "speed over PyTorch", "file MiB")  # fmt: skip
    rows = [(f"{Path(r['model']).name} ({r['model_type']})", r["runtime"], f"{100 * r['accuracy']:.2f}",
             f"{100 * r['accuracy_change']:+.2f}", f"{r['loss']:.3f}", f"{r['tokens_per_s']:,.0f}",
             f"{r['speed_to_pytorch']:.2f}x", "–" if r["file_mib"] is None else f"{r['file_mib']:.1f}")
            for r in result["rows"]]  # fmt: skip
    title = (f"{result['masked_tokens']:,} masked tokens of {result['tokens']:,}, blocks of {result['length']}, "
             f"{result['threads']} thread(s)")  # fmt: skip
    return "\n".join([title, "", *table_lines(header, rows), ""])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", required=True, help="masked-LM folders (Orchid, BERT)")
    parser.add_argument("--validation_file", required=True, help="held-out text, one document a line")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: each model's own)")
    parser.add_argument("--length", type=int, default=128, help="tokens a block, [CLS] and [SEP] included")
    parser.add_argument("--tokens-per-batch", type=int, default=4096, help="tokens a call")
    parser.add_argument("--max-tokens", type=int, default=0, help="read the first this many tokens (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="the masking's seed")
    parser.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime intra-op threads")
    parser.add_argument("--out-dir", default="docs/results", help="folder of int8_cpu_threadsN.json and .md")
    args = parser.parse_args(argv)
    check_at_least(parser, args, "--threads", "--tokens-per-batch")
    check_at_least(parser, args, "--length", minimum=3)
    if not Path(args.validation_file).is_file():
        parser.error(f"--validation_file {args.validation_file}: no such file")
    torch.set_num_threads(args.threads)
    rows = [row for folder in args.models for row in run_model(folder, args)]
    # Each model reads the text with its own tokenizer: the title gives the first model's counts.
    result = {"benchmark": "int8", "length": args.length, "threads": args.threads, "tokens": rows[0]["tokens"],
              "masked_tokens": rows[0]["masked_tokens"], "rows": rows,
              "command": "python scripts/int8_benchmark.py " + " ".join(sys.argv[1:] if argv is None else argv),
              **provenance(args.threads)}  # fmt: skip
    write_result(result, args.out_dir, f"int8_cpu_threads{args.threads}", markdown)
    return result
