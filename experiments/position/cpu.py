"""The CPU kernels every run of the sweep uses, pinned so that the same seed gives the same bits on any x86 CPU.

PyTorch picks its vectorised kernels for the CPU it runs on (AVX-512 where the CPU has it, AVX2 otherwise), and
MKL and oneDNN do the same for theirs; float32 sums then round differently, and a trained model's weights differ
from one kind of CPU to another. Capping all three at AVX2, which every x86-64 CPU of the last decade has, and
running each model on one thread gives the same kernels everywhere. The variables are read when torch is
imported, so they are set in the environment of the worker processes before those import torch (and in the
main process by ``python -m experiments.run`` before it imports torch); each run records the capability torch
reports (``torch.backends.cpu.get_cpu_capability()``), which shows whether the pin took effect.

This module imports nothing heavy: it can run before torch is imported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

#: The environment of every worker: kernels capped at AVX2, one thread.
PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
#: What ``torch.backends.cpu.get_cpu_capability()`` reports under the pin, on an x86 CPU with AVX2.
EXPECTED_CAPABILITY = "AVX2"


def pin_here() -> bool:
    """Set ``PINNED`` in this process's environment if torch is not imported yet.

    Returns:
        True if the environment now holds the pin and torch will read it; False if torch was
        already imported (then only processes started from now on get it: see :func:`pinned`).
    """
    import sys

    if "torch" in sys.modules:
        return all(os.environ.get(k) == v for k, v in PINNED.items())
    os.environ.update(PINNED)
    return True


@contextmanager
def pinned() -> Iterator[dict[str, str]]:
    """Within the block, the process environment holds ``PINNED``, which every process started in it
    inherits (the sweep's workers); the previous values are restored after it.

    Yields:
        the pinned variables.
    """
    before = {k: os.environ.get(k) for k in PINNED}
    os.environ.update(PINNED)
    try:
        yield dict(PINNED)
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
