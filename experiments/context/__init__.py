"""What the rope scalings do to a model past its training length: tiny byte-level models of mpmath's source.

``python -m experiments.context`` (``make context-experiment``) runs the sweep of :mod:`.sweep`; the chapter
``book/09_context_extension.ipynb`` reads its results file.
"""
