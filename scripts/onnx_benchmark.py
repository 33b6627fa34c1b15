"""ONNX Runtime against PyTorch for the same Orchid model on padded batches; see ``benchmarks/onnx_runtime.py``.

    python scripts/onnx_benchmark.py --threads 1
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
from benchmarks.onnx_runtime import main  # noqa: E402

if __name__ == "__main__":
    main()
