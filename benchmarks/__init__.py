"""The speed and memory benchmark of Orchid against BERT and attention (``scripts/benchmark.py``); not part of the
installed package. ``candidates`` (what is compared), ``settings`` (one run's settings), ``parts`` (the operator,
model and train parts), ``measure`` (worker processes and rounds), ``report`` (ratios, tables, plot), ``profiles``
(``--profile``, ``--profile-train``) and ``speed`` (the command line); ``lengths``, ``small_step``, ``long_step`` and
``pretraining`` are the smaller benchmarks of their scripts. ``gpu`` is the GPU check (``scripts/gpu_check.py``), and
``source_tree`` imports ``orchid_hf`` from the source tree where it is not installed.

``harness`` is what the research code shares, benchmarks and experiments alike: timing, peak memory, the commit and
machine every result file records, Markdown tables, the generated blocks of the doc pages."""
