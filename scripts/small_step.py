"""A training step of small models, Orchid against ViT and BERT of the same size; see ``benchmarks/small_step.py``.

    python scripts/small_step.py --threads 1
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
from benchmarks.small_step import main  # noqa: E402

if __name__ == "__main__":
    main()
