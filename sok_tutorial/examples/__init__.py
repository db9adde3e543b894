"""Runnable training scripts (``python -m sok_tutorial.examples.<name>``), used by the notebooks,
the tests and the benchmarks."""
