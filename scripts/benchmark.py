"""Speed and memory of Orchid against attention; see ``orchid_hf/benchmark.py`` and docs/performance.md.

    python scripts/benchmark.py                      # operator series and model shapes, CPU, 1 thread
    python scripts/benchmark.py --quick              # tiny sizes, seconds
    python scripts/benchmark.py --parts model --tag after --out-dir outputs/bench
"""

from orchid_hf.benchmark import main

if __name__ == "__main__":
    main()
