"""Speed and memory of Orchid against BERT and attention; see ``benchmarks/speed.py`` and docs/performance.md.

    python scripts/benchmark.py                      # operator series and model shapes, CPU, 1 thread
    python scripts/benchmark.py --quick              # tiny sizes, seconds
    python scripts/benchmark.py --parts model --tag after --out-dir outputs/bench
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ and experiments/ are not installed
from benchmarks.speed import main  # noqa: E402

if __name__ == "__main__":
    main()
