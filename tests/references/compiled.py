"""What the compile and export tests and book/11_gpu.ipynb share: the tolerance between two sin/cos kernels,
a torch.compile backend that records the traced graph, and the smallest model that holds the module.

tests/deployment/test_compile.py (CPU), tests/deployment/test_gpu.py (CUDA), tests/rotary/test_rotation.py and
the chapter use them; the tolerance is derived in ``tolerance``'s docstring and stated in the chapter.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc import PositionalEncoding


def tolerance(dtype: torch.dtype, max_angle: float) -> dict[str, float]:
    """``atol``/``rtol`` for ``x + PE`` when PE comes from two different sin/cos kernels.

    Both kernels form the float64 angle ``p * omega_i`` and take its sine or cosine. Each kernel's sin, cos and pow
    is within 2 ulps (CUDA's documented maximum in double precision; ATen's and inductor's CPU kernels are within
    1), so two sines of the same angle differ by at most 4 ulps of a value <= 1, 4 * 2**-53; two frequencies
    ``base**(-2i/d)`` differ by at most 4 ulps, a relative 4 * 2**-52 = 2**-50, which moves an angle, and its
    sine, by up to ``angle * 2**-50``. So in float64 ``|dPE| <= 2**-51 * (1 + 2 * max_angle)``. Rounded to
    float32 or half, differences that small can only flip a rounding, by one ulp of a value below 1: ``eps / 2``.
    Adding x rounds once more: ``rtol = eps``.
    """
    eps = torch.finfo(dtype).eps
    atol = 2.0**-51 * (1 + 2 * max_angle) if dtype == torch.float64 else eps / 2
    return {"atol": atol, "rtol": eps}


def recording_backend(graphs: list[torch.fx.GraphModule]):
    """A torch.compile backend that keeps the traced graph and runs it eagerly (no code generation)."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    return backend


class TinyModel(nn.Module):
    """Embedding -> positional encoding -> linear: the smallest model that uses the module."""

    def __init__(
        self,
        vocab: int = 50,
        d_model: int = 16,
        max_len: int = 32,
        batch_first: bool = False,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pe = PositionalEncoding(
            d_model, dropout_prob=0.1, max_len=max_len, batch_first=batch_first
        )
        self.out = nn.Linear(d_model, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.pe(self.embed(tokens)))
