"""Does position matter? Tiny decoders trained with each positional scheme (see ``book/08_position_matters``).

- :mod:`experiments.position.tasks`: copy, reverse and sort, as token sequences.
- :mod:`experiments.position.model`: the decoder and its six positional schemes.
- :mod:`experiments.position.train`: training until a convergence rule (or a cap), teacher-forced evaluation at
  every length (exact match equal to greedy decoding's), probes, one run's record with the hash of its weights.
- :mod:`experiments.position.sweep`: a learning rate per (task, scheme) from a grid, then ten seeds of each, in
  worker processes with pinned CPU kernels; t and Clopper-Pearson summaries; re-running recorded runs bit for bit.
- :mod:`experiments.position.cpu`: the pinned kernels (AVX2, one thread), set before torch is imported.
"""
