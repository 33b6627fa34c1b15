"""Speed and memory benchmarks of Orchid against attention (``scripts/benchmark.py``); not part of the installed
package."""
