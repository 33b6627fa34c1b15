"""Check and measure Orchid on a GPU in one command (benchmarks/gpu.py; docs/performance.md, "On a GPU"):
correctness against the CPU, bf16 training, speed and memory against attention and BERT, associative recall at long
lengths. Writes gpu_check.json and gpu_check.md into --out (default: $OUT). Runs from a copy of the repository without
the package installed.

    python3 scripts/gpu_check.py --out "$OUT" --commit REV      # on the GPU machine: under 8 minutes on one H100
    python3 scripts/gpu_check.py --device cpu --tiny --out /tmp/gpu_check   # every stage at toy sizes, seconds
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ and experiments/ are not installed
from benchmarks.gpu import main  # noqa: E402

if __name__ == "__main__":
    main()
