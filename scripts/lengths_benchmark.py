"""What a sequence's length costs Orchid and BERT: a short batch in long-context models, and a workload of many lengths;
see ``benchmarks/lengths.py``.

    python scripts/lengths_benchmark.py --threads 1
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
from benchmarks.lengths import main  # noqa: E402

if __name__ == "__main__":
    main()
