"""Exact and float64 references for the encodings, independent of posenc's code path.

- The sinusoidal encoding of "Attention Is All You Need" (Vaswani et al., 2017, section 3.5): in NumPy float64
  (``numpy_encoding``, both layouts and both frequency schedules) and with 40 significant digits
  (``exact_encoding``, mpmath); ``round_once`` rounds float64 values once to a half dtype (NumPy's direct
  float64 -> float16 conversion; round-to-nearest-even on the float64 bits for bfloat16); ``half_ulp`` is half a
  unit in the last place. tests/sinusoidal/test_encoding_precision.py checks these against exact values and
  torch's conversions; book/01_derivation.ipynb prints posenc's error against ``exact_encoding``.
- The time-step embedding of DDPM/ADM (diffusers' ``flip_sin_to_cos`` and ``downscale_freq_shift``) with 40
  significant digits (``exact_embedding``), and the ``(flip_sin_to_cos, shift)`` settings the tests sweep
  (``TIMESTEP_SETTINGS``); tests/sincos/test_embeddings.py and tests/tools/test_bench_sincos.py compare with it.
"""

from __future__ import annotations

import mpmath
import numpy as np
import torch


def numpy_omega(
    d_model: int, base: float = 10000.0, schedule: str = "paper"
) -> np.ndarray:
    """The frequencies in NumPy float64: [ceil(d_model / 2)]."""
    i = np.arange((d_model + 1) // 2, dtype=np.float64)
    if schedule == "paper":
        return base ** (-2.0 * i / d_model)
    m = d_model // 2
    omega = base ** (-i / max(m - 1, 1))
    if d_model % 2:
        omega[-1] = 0.0
    return omega


def numpy_encoding(
    positions: np.ndarray,
    d_model: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    schedule: str = "paper",
) -> np.ndarray:
    """The encoding in NumPy float64: [*positions.shape, d_model]."""
    angle = np.asarray(positions, dtype=np.float64)[..., None] * numpy_omega(
        d_model, base, schedule
    )
    sin, cos = np.sin(angle), np.cos(angle)
    if layout == "interleaved":
        return np.stack([sin, cos], axis=-1).reshape(*angle.shape[:-1], -1)[
            ..., :d_model
        ]
    if schedule == "tensor2tensor" and d_model % 2:
        return np.concatenate([sin[..., :-1], cos[..., :-1], sin[..., -1:]], axis=-1)
    return np.concatenate([sin, cos[..., : d_model // 2]], axis=-1)


def exact_encoding(positions: list[int], d_model: int, base: int = 10000) -> np.ndarray:
    """The paper's encoding evaluated with 40 significant digits (mpmath), rounded to float64: [n, d_model]."""
    with mpmath.workdps(40):
        omega = [
            mpmath.power(base, mpmath.mpf(-2 * i) / d_model)
            for i in range((d_model + 1) // 2)
        ]
        rows = [
            [f(p * w) for w in omega for f in (mpmath.sin, mpmath.cos)][:d_model]
            for p in positions
        ]
    return np.array(rows, dtype=np.float64)


def bfloat16_round_once(x: np.ndarray) -> np.ndarray:
    """float64 -> nearest bfloat16 (ties to even) in one step, returned as float64. Normal range only."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    if np.any((x != 0) & (np.abs(x) < 2.0**-126)):
        raise ValueError("bfloat16_round_once handles normal numbers only")
    bits = x.view(np.int64)
    # keep 1 + 11 + 7 bits: drop 45 mantissa bits, rounding to nearest, ties to the even kept bit
    keep_lsb = (bits >> 45) & 1
    rounded = (bits + ((1 << 44) - 1) + keep_lsb) & ~np.int64((1 << 45) - 1)
    return rounded.view(np.float64)


def round_once(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """float64 values rounded once to ``dtype`` (as float64 values)."""
    if dtype == torch.float16:
        return x.astype(np.float16).astype(
            np.float64
        )  # NumPy converts float64 -> float16 directly
    if dtype == torch.bfloat16:
        return bfloat16_round_once(x)
    return torch.from_numpy(x).to(dtype).double().numpy()


def half_ulp(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Half a unit in the last place of ``dtype`` at |x| (float16 subnormals included)."""
    mantissa_bits, min_exp = {
        torch.float16: (10, -14),
        torch.bfloat16: (7, -126),
        torch.float32: (23, -126),
    }[dtype]
    _, e = np.frexp(np.abs(x))  # |x| = m * 2**e, m in [0.5, 1)
    return np.ldexp(0.5, np.maximum(e - 1, min_exp) - mantissa_bits)


TIMESTEP_SETTINGS = [
    (False, 1.0),
    (True, 0.0),
    (True, 1.0),
    (False, 0.0),
]  # (flip_sin_to_cos, shift)


def exact_embedding(
    t: torch.Tensor, dim: int, flip: bool, shift: float, scale: float, max_period: float
) -> torch.Tensor:
    """The time-step embedding in 40-digit arithmetic (mpmath), rounded to float64: ``[N, dim]``."""
    mpmath.mp.dps = 40
    half = dim // 2
    out = torch.zeros(len(t), dim, dtype=torch.float64)
    omega = [
        mpmath.mpf(max_period) ** (-mpmath.mpf(j) / (half - mpmath.mpf(shift)))
        for j in range(half)
    ]
    for n, tn in enumerate(t.double().tolist()):
        for j in range(half):
            theta = mpmath.mpf(scale) * mpmath.mpf(tn) * omega[j]
            sin, cos = float(mpmath.sin(theta)), float(mpmath.cos(theta))
            out[n, j], out[n, half + j] = (cos, sin) if flip else (sin, cos)
    return out
