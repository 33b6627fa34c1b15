"""Dynamic int8 quantisation in ONNX Runtime on a real task, Orchid beside BERT; see ``benchmarks/int8.py``.

    python scripts/int8_benchmark.py --models MLM_FOLDER [MLM_FOLDER ...] --validation_file TEXT --threads 1
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
from benchmarks.int8 import main  # noqa: E402

if __name__ == "__main__":
    main()
