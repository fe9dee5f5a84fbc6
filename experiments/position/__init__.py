"""Does position matter? Tiny decoders trained with each positional scheme (see ``book/12_position_matters``).

- :mod:`experiments.position.tasks`: copy, reverse and sort, as token sequences.
- :mod:`experiments.position.model`: the decoder and its six positional schemes.
- :mod:`experiments.position.train`: training, greedy evaluation at every length, one run's record.
- :mod:`experiments.position.sweep`: every (task, scheme, seed), in parallel, into a results file.
"""
