"""Experiments that use posenc: training harnesses, not part of the library.

``experiments.position`` trains tiny decoder-only transformers with each positional scheme on copy, reverse
and sort, and measures accuracy inside and beyond the training lengths (``python -m experiments.run``;
the chapter ``book/08_position_matters.ipynb`` reads its results file).
"""
