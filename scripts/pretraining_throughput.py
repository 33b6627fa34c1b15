"""Masked-LM pretraining throughput of Orchid-BERT-base and BERT-base through the same recipe; see
``benchmarks/pretraining.py``.

    python scripts/pretraining_throughput.py --train_file ../shared/data/austen/emma.txt \\
        --tokenizer_name ../shared/data/bert-base-uncased --threads 1
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
from benchmarks.pretraining import main  # noqa: E402

if __name__ == "__main__":
    main()
