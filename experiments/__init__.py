"""The project's experiments, run by the scripts in ``scripts/``; not part of the installed package: associative
recall (``recall``), the real-data comparison (``real_data``), the transfer diagnosis (``transfer``), images in two
dimensions (``images_2d``) and sentence embeddings (``sentence_embeddings``). They measure and report with the
research harness, ``benchmarks/harness.py``."""
