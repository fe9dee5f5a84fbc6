"""The census: posenc's rotary swap over every family of the installed transformers that defines a rotary class.

- :mod:`tests.census.discovery`: which families (their modeling code, parsed);
- :mod:`tests.census.builder`: a tiny random model of each, from a generic config builder and a few overrides;
- the swap under test is the package's own, ``posenc.swap_rotary(model)`` (posenc/conventions/hf.py);
- :mod:`tests.census.compare`: one family's entry (logits, greedy generation, the two controls);
- :mod:`tests.census.runner`: every family in a pool of two processes, the table and the results JSON.

``python -m tests.census`` prints the table and writes benchmarks/results/census-transformers-<version>.json;
tests/conventions/test_hf_census.py runs it and asserts its rules.
"""
