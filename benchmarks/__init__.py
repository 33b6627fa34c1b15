"""The speed and memory benchmark of Orchid against BERT and attention (``scripts/benchmark.py``); not part of the
installed package. ``candidates`` (what is compared), ``settings`` (one run's settings), ``parts`` (the operator,
model and train parts), ``measure`` (worker processes, rounds, time and memory), ``report`` (ratios, tables, plot),
``profiles`` (``--profile``, ``--profile-train``) and ``speed`` (the command line). ``gpu`` is the GPU check
(``scripts/gpu_check.py``), and ``source_tree`` imports ``orchid_hf`` from the source tree where it is not installed."""
