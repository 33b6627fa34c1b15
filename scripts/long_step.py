"""One training step of a 12-layer Orchid model at one long sequence; see ``benchmarks/long_step.py``.

    python scripts/long_step.py --head sequence-classification --length 65536 --checkpointing
    python scripts/long_step.py --head masked-lm --length 16384
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ and experiments/ are not installed
from benchmarks.long_step import main  # noqa: E402

if __name__ == "__main__":
    main()
