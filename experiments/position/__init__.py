"""Does position matter? Tiny decoders trained with each positional scheme (see ``book/08_position_matters``).

- :mod:`experiments.position.tasks`: copy, reverse and sort, as token sequences.
- :mod:`experiments.position.model`: the decoder and its six positional schemes.
- :mod:`experiments.position.train`: training, teacher-forced evaluation at every length (exact match equal to greedy
  decoding's), probes, one run's record.
- :mod:`experiments.position.sweep`: every (task, scheme, seed), in parallel, two stages of seeds, bootstrap
  summaries, into a results file that records the commit of this code.
"""
