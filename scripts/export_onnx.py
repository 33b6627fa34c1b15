#!/usr/bin/env python
"""Export a saved Orchid model to ONNX (docs/deployment.md):

    python scripts/export_onnx.py MODEL_DIR OUT.onnx            # a folder written by save_pretrained, or a Hub id
    python scripts/export_onnx.py MODEL_DIR OUT.onnx --verify   # and compare ONNX Runtime with PyTorch

The model is loaded as the class its config names (``architectures``), e.g. OrchidForSequenceClassification; the
graph takes batches of any size and any length up to the model's ``max_position_embeddings``. ``--verify`` runs the
file with ONNX Runtime on random padded batches of other shapes than the export example, prints the largest
absolute difference from PyTorch of each output, and fails above ``--atol``. Needs the ``onnx`` extra
(``pip install "orchid-hf[onnx]"``).
"""

from __future__ import annotations

import argparse

from orchid_hf.runs import run_cli


def main(argv: list[str] | None = None) -> str:
    from orchid_hf.onnx import VERIFY_ATOL, compare_with_onnxruntime, export_onnx, load_for_export

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a folder written by save_pretrained (or a Hub id)")
    parser.add_argument("output", help="the ONNX file to write (.onnx)")
    parser.add_argument("--verify", action="store_true", help="compare ONNX Runtime's outputs with PyTorch's")
    parser.add_argument("--atol", type=float, default=VERIFY_ATOL,
                        help=f"largest absolute difference --verify accepts (default {VERIFY_ATOL})")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    args = parser.parse_args(argv)
    model = load_for_export(args.model)
    path = export_onnx(model, args.output, opset_version=args.opset)
    print(f"wrote {path} ({type(model).__name__})")
    if args.verify:
        differences = compare_with_onnxruntime(model, path)
        for name, difference in differences.items():
            print(f"{name}: ONNX Runtime against PyTorch, largest absolute difference {difference:.3g}")
        worst = max(differences.values())
        if worst > args.atol:
            raise ValueError(f"the ONNX graph differs from PyTorch by up to {worst:.3g} > --atol {args.atol}")
    return str(path)


if __name__ == "__main__":
    run_cli(main)
