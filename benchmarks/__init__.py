"""Benchmarks of posenc against the classic recipes and the memory roofline (run ``benchmarks/bench.py``)."""
