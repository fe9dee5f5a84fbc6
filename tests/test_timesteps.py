"""posenc.timestep_embedding, sincos_grid, detr_sine_encoding and their modules, with the package alone.

Checked against mpmath (float32 within 2^-24 of the exact values), against the recipes restated from their sources
in tests/sincos_peers.py (DDPM, ADM/DiT, MAE/DiT, MoCo v3, Big Vision, DETR, NeRF), and for the structure the
chapter (book/07_timesteps_and_grids.ipynb) derives: every grid convention a permutation or a schedule of one
reference, the shortcut for expanded time steps, the modules' empty state, and every bad input. The installed
diffusers, timm and transformers are compared in tests/test_timesteps_peers.py (this file runs on the package's
floor, without them).
"""

from __future__ import annotations

import copy
import math
import pickle

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import (
    GRID_CONVENTIONS,
    PositionEmbeddingSine,
    Timesteps,
    detr_sine_encoding,
    sincos_grid,
    sinusoidal_encoding,
    timestep_embedding,
)
from posenc.encoding import _round_once
from posenc.sincos import _sincos
from tests.sincos_peers import (
    adm_timestep_embedding,
    big_vision_posemb_sincos_2d,
    ddpm_get_timestep_embedding,
    detr_position_embedding_sine,
    float32_bound,
    float64_bound,
    mae_2d_sincos_pos_embed,
    mocov3_2d_sincos,
    nerf_embed,
)

F64 = torch.float64
SETTINGS = [
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
    out = torch.zeros(len(t), dim, dtype=F64)
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


def angles(t: torch.Tensor, dim: int, shift: float, base: float = 1e4) -> torch.Tensor:
    """The angle behind each channel of a time-step embedding: ``[N, dim]`` (0 for the zero channel)."""
    half = dim // 2
    omega = base ** (-torch.arange(half, dtype=F64) / (half - shift))
    theta = (t.double()[:, None] * omega).repeat(1, 2)
    return torch.nn.functional.pad(theta, (0, dim % 2))


# ----------------------------------------------------------------------------------------------------------
# timestep_embedding: precision
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("flip", "shift"), SETTINGS)
@pytest.mark.parametrize("dim", [64, 7])
def test_float32_is_within_2_24_of_the_exact_values(flip, shift, dim):
    torch.manual_seed(dim)
    t = torch.cat([torch.tensor([0.0, 1.0, 999.0]), torch.rand(9) * 1000])
    t = torch.cat([t, torch.rand(4) * 2**20])  # far beyond any schedule
    exact = exact_embedding(t, dim, flip, shift, 1.0, 10000)
    ours = timestep_embedding(t, dim, flip_sin_to_cos=flip, downscale_freq_shift=shift)
    assert ours.dtype == torch.float32 and ours.shape == (len(t), dim)
    assert (ours.double() - exact).abs().max() <= 2**-24
    ours64 = timestep_embedding(
        t, dim, flip_sin_to_cos=flip, downscale_freq_shift=shift, dtype=F64
    )
    # float64: the rounding of angles up to 2^20 and of one sine; within 1e-12 below 1000
    assert (ours64 - exact).abs().max() <= 2**-53 * (4 * 2**20 + 4)
    assert (ours64 - exact)[t < 1000].abs().max() <= 1e-12


def test_scale_and_max_period_are_exact_too():
    t = torch.rand(8, dtype=F64)  # time in [0, 1], scaled to [0, 1000]
    exact = exact_embedding(t, 32, True, 0.0, 1000.0, 5000.0)
    ours = timestep_embedding(
        t, 32, flip_sin_to_cos=True, downscale_freq_shift=0, scale=1000, max_period=5000
    )
    assert (ours.double() - exact).abs().max() <= 2**-24
    # scale multiplies the time steps: bitwise the same as scaling them in float64 first
    assert torch.equal(
        ours,
        timestep_embedding(
            t * 1000, 32, flip_sin_to_cos=True, downscale_freq_shift=0, max_period=5000
        ),
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_the_float64_value_rounded_once(dtype):
    t = torch.rand(64) * 1000
    ours = timestep_embedding(t, 320, dtype=dtype)
    assert ours.dtype == dtype
    assert torch.equal(ours, _round_once(timestep_embedding(t, 320, dtype=F64), dtype))


@given(
    t=st.lists(st.floats(0, 2**24, allow_nan=False, width=32), min_size=1, max_size=6),
    dim=st.integers(4, 40),
    flip=st.booleans(),
    shift=st.sampled_from([0.0, 1.0, 0.5]),
)
@settings(max_examples=25, deadline=None)
def test_float32_within_2_24_for_any_time_step(t, dim, flip, shift):
    t = torch.tensor(t, dtype=torch.float32)
    exact = exact_embedding(t, dim, flip, shift, 1.0, 10000)
    ours = timestep_embedding(t, dim, flip_sin_to_cos=flip, downscale_freq_shift=shift)
    assert (ours.double() - exact).abs().max() <= 2**-24


# ----------------------------------------------------------------------------------------------------------
# timestep_embedding: the recipes and the layout
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [256, 320, 7, 9])
def test_reproduces_ddpm_and_adm_restated(dim):
    t = torch.cat([torch.arange(0, 1000.0, 3), torch.rand(100) * 1000])
    bound = float64_bound(1000.0, 1e4)
    ddpm = timestep_embedding(t, dim, dtype=F64)
    adm = timestep_embedding(
        t, dim, flip_sin_to_cos=True, downscale_freq_shift=0, dtype=F64
    )
    assert (ddpm_get_timestep_embedding(t, dim, dtype=F64) - ddpm).abs().max() <= bound
    assert (adm_timestep_embedding(t, dim, dtype=F64) - adm).abs().max() <= bound
    # the sources' own float32 arithmetic: within their float32 error, eq-ts-float32
    for theirs, ours, shift in (
        (ddpm_get_timestep_embedding(t, dim), ddpm, 1.0),
        (adm_timestep_embedding(t, dim), adm, 0.0),
    ):
        theta = angles(t, dim, shift)
        assert ((theirs.double() - ours).abs() <= float32_bound(theta, 1e4)).all()


def test_the_float32_bound_tells_the_conventions_apart():
    # a shift of 1 instead of 0 (diffusers' DiT port against DiT) is far outside the bound
    t = torch.arange(1, 1000.0)
    port = timestep_embedding(t, 256, flip_sin_to_cos=True, downscale_freq_shift=1)
    dit = timestep_embedding(
        t, 256, flip_sin_to_cos=True, downscale_freq_shift=0, dtype=F64
    )
    outside = (port.double() - dit).abs() > float32_bound(angles(t, 256, 0.0), 1e4)
    assert outside.any(dim=-1).all()  # at every time step from t = 1 on


def test_flip_swaps_the_halves_and_odd_widths_end_with_a_zero_channel():
    t = torch.rand(20) * 1000
    for dim in (64, 65):
        half = dim // 2
        plain = timestep_embedding(t, dim, downscale_freq_shift=0)
        flipped = timestep_embedding(
            t, dim, flip_sin_to_cos=True, downscale_freq_shift=0
        )
        assert torch.equal(flipped[:, :half], plain[:, half : 2 * half])
        assert torch.equal(flipped[:, half : 2 * half], plain[:, :half])
        if dim % 2:
            assert torch.equal(flipped[:, -1], torch.zeros(20))
            assert torch.equal(plain[:, -1], torch.zeros(20))


def test_integer_and_float_time_steps_give_the_same_bits():
    steps = torch.arange(0, 1000, 7)
    for dtype in (torch.int64, torch.int32, torch.float32, torch.float64):
        assert torch.equal(
            timestep_embedding(steps.to(dtype), 128),
            timestep_embedding(steps.double(), 128),
        )


def test_an_expanded_time_step_is_computed_once_with_the_same_bits():
    t = torch.tensor(437.25).expand(64)
    assert t.stride(0) == 0
    for dim in (320, 7):
        short = timestep_embedding(t, dim, flip_sin_to_cos=True)
        full = timestep_embedding(t.contiguous(), dim, flip_sin_to_cos=True)
        assert torch.equal(short, full) and short.is_contiguous()
        assert short.shape == (64, dim)
    # one time step, and an empty batch
    assert timestep_embedding(torch.tensor([5.0]), 8).shape == (1, 8)
    assert timestep_embedding(torch.zeros(0), 8).shape == (0, 8)


def test_the_dit_shift_measured_in_the_chapter():
    steps = torch.arange(1000.0)
    kw = {"flip_sin_to_cos": True, "dtype": F64}
    dit = timestep_embedding(steps, 256, downscale_freq_shift=0, **kw)
    port = timestep_embedding(steps, 256, downscale_freq_shift=1, **kw)
    gap = (port - dit).abs().amax(-1)
    assert round(gap[999].item(), 2) == 1.94
    assert round(gap.max().item(), 2) == 1.98 and int(gap.argmax()) == 998
    step = (dit[1:] - dit[:-1]).norm(dim=-1)
    assert (step.max() - step.min()) < 1e-12  # the same distance at every t
    assert round(((port - dit)[999].norm() / step[0]).item(), 1) == 4.3
    assert 0.4 < (port[999] @ dit[999] / 128).item() < 0.6  # "about one half"
    # the port's embedding at t = 999 is no time step of DiT's: farther than one step
    fine = torch.arange(900.0, 1100.0, 0.05)
    grid = timestep_embedding(fine, 256, downscale_freq_shift=0, **kw)
    nearest = (grid - port[999]).norm(dim=-1)
    assert nearest.min() > step[0] and round(fine[nearest.argmin()].item(), 1) == 986.2


# ----------------------------------------------------------------------------------------------------------
# sincos_grid
# ----------------------------------------------------------------------------------------------------------


def _tokens(shape):
    """Each token's index per axis, row-major: ``[prod(shape), len(shape)]``."""
    grids = torch.meshgrid(*[torch.arange(s) for s in shape], indexing="ij")
    return torch.stack([g.flatten() for g in grids], -1)


@pytest.mark.parametrize("shape", [(6, 10), (7, 3), (4, 4)])
def test_grid_conventions_are_one_reference(shape):
    d, q = 64, 16
    idx = _tokens(shape)
    rows, cols = idx[:, 0], idx[:, 1]
    concat = {"layout": "concat", "dtype": F64}
    by_col = sinusoidal_encoding(cols, d // 2, **concat)
    by_row = sinusoidal_encoding(rows, d // 2, **concat)
    mae = sincos_grid(shape, d, dtype=F64)
    assert torch.equal(mae, torch.cat([by_col, by_row], -1))  # [columns | rows]
    assert torch.equal(
        sincos_grid(shape, d, convention="mocov3", dtype=F64),
        torch.cat([by_row, by_col], -1),
    )
    assert torch.equal(
        sincos_grid(shape, d, convention="timm", dtype=F64),
        torch.cat([by_row[:, :q], by_col[:, :q], by_row[:, q:], by_col[:, q:]], -1),
    )
    t2t = {"layout": "concat", "frequencies": "tensor2tensor", "dtype": F64}
    assert torch.equal(
        sincos_grid(shape, d, convention="big_vision", dtype=F64),
        torch.cat(
            [
                sinusoidal_encoding(cols, d // 2, **t2t),
                sinusoidal_encoding(rows, d // 2, **t2t),
            ],
            -1,
        ),
    )


def test_grid_in_one_and_three_axes():
    assert torch.equal(
        sincos_grid((50,), 64, dtype=F64),
        sinusoidal_encoding(50, 64, layout="concat", dtype=F64),
    )
    shape, d = (3, 4, 5), 96
    idx = _tokens(shape)
    mae = sincos_grid(shape, d, dtype=F64)  # the last axis first, d/3 each
    blocks = [
        sinusoidal_encoding(idx[:, a], 32, layout="concat", dtype=F64)
        for a in (2, 1, 0)
    ]
    assert torch.equal(mae, torch.cat(blocks, -1))
    d = 64  # diffusers_3d: [frames (d/4) | columns (3d/8) | rows (3d/8)]
    cog = sincos_grid(shape, d, convention="diffusers_3d", dtype=F64)
    blocks = [
        sinusoidal_encoding(idx[:, 0], 16, layout="concat", dtype=F64),
        sinusoidal_encoding(idx[:, 2], 24, layout="concat", dtype=F64),
        sinusoidal_encoding(idx[:, 1], 24, layout="concat", dtype=F64),
    ]
    assert torch.equal(cog, torch.cat(blocks, -1))


def test_grid_scale_divides_the_positions_per_axis():
    shape, d = (5, 8), 32
    idx = _tokens(shape).double()
    ours = sincos_grid(shape, d, scale=(2.5, 0.75), dtype=F64)
    w = _sincos(idx[:, 1] / 0.75, 8, 0.0, 1e4, False)
    h = _sincos(idx[:, 0] / 2.5, 8, 0.0, 1e4, False)
    assert torch.equal(ours, torch.cat([w, h], -1))
    assert torch.equal(
        sincos_grid(shape, d, scale=2.0, dtype=F64),
        sincos_grid(shape, d, scale=(2.0, 2.0), dtype=F64),
    )


@pytest.mark.parametrize("convention", ["mae", "big_vision", "mocov3", "timm"])
def test_grid_float32_within_2_24_and_half_rounded_once(convention):
    table64 = sincos_grid((9, 13), 64, convention=convention, dtype=F64)
    table32 = sincos_grid((9, 13), 64, convention=convention)
    assert table32.shape == (9 * 13, 64) and table32.dtype == torch.float32
    assert (table32.double() - table64).abs().max() <= 2**-25
    for dtype in (torch.float16, torch.bfloat16):
        half = sincos_grid((9, 13), 64, convention=convention, dtype=dtype)
        assert torch.equal(half, _round_once(table64, dtype))


@pytest.mark.parametrize(("n", "d"), [(8, 64), (14, 384), (5, 12)])
def test_grid_reproduces_mae_dit_and_mocov3_on_square_grids(n, d):
    ours = sincos_grid((n, n), d, dtype=F64)
    theirs = torch.from_numpy(mae_2d_sincos_pos_embed(d, n))  # also DiT's copy
    assert (theirs - ours).abs().max() <= float64_bound(n, 1e4)
    moco = mocov3_2d_sincos(n, n, d)  # float32, as MoCo v3 runs
    ours = sincos_grid((n, n), d, convention="mocov3", dtype=F64)
    theta = torch.full_like(ours, float(n))  # every angle is below the largest index
    assert ((moco.double() - ours).abs() <= float32_bound(theta, 1e4)).all()
    assert (mocov3_2d_sincos(n, n, d, dtype=F64) - ours).abs().max() <= float64_bound(
        n, 1e4
    )


@pytest.mark.parametrize(("h", "w"), [(3, 5), (6, 10), (7, 2)])
def test_mocov3_transposes_non_square_grids_and_big_vision_does_not(h, w):
    d = 64
    moco = mocov3_2d_sincos(h, w, d, dtype=F64)
    bound = float64_bound(max(h, w), 1e4)
    # MoCo v3's table for an h x w grid is the table of the w x h grid ...
    assert (
        moco - sincos_grid((w, h), d, convention="mocov3", dtype=F64)
    ).abs().max() <= bound
    # ... so its rows do not match the h x w patches they are added to
    assert (
        moco - sincos_grid((h, w), d, convention="mocov3", dtype=F64)
    ).abs().max() > 0.1
    bv = sincos_grid((h, w), d, convention="big_vision", dtype=F64)
    theirs = torch.from_numpy(big_vision_posemb_sincos_2d(h, w, d, dtype=np.float64))
    assert (theirs - bv).abs().max() <= bound
    theirs32 = torch.from_numpy(big_vision_posemb_sincos_2d(h, w, d))  # as JAX runs it
    theta = torch.full_like(bv, float(max(h, w)))
    assert ((theirs32.double() - bv).abs() <= float32_bound(theta, 1e4)).all()


def test_mae_and_dit_size_their_table_for_square_grids_only():
    # their callers pass int(num_patches ** 0.5): 15 patches of a 3 x 5 grid get 9 rows
    assert mae_2d_sincos_pos_embed(64, int(15**0.5)).shape == (9, 64)
    assert sincos_grid((3, 5), 64).shape == (15, 64)


# ----------------------------------------------------------------------------------------------------------
# DETR and NeRF
# ----------------------------------------------------------------------------------------------------------


def _padding_mask(batch: int, h: int, w: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, h, w, dtype=torch.bool)
    for b in range(batch):
        rows = int(torch.randint(1, h + 1, (), generator=gen))
        cols = int(torch.randint(1, w + 1, (), generator=gen))
        mask[b, :rows, :cols] = False
    mask[-1] = True  # one image entirely padding: eps keeps it finite
    return mask


@pytest.mark.parametrize(
    ("num_pos_feats", "kw"),
    [
        (64, {"normalize": True}),
        (128, {"normalize": True}),
        (64, {"normalize": False}),
        (32, {"normalize": True, "scale": 1.0}),
        (32, {"normalize": True, "temperature": 20}),
    ],
)
def test_detr_is_detr_bit_for_bit_or_closer(num_pos_feats, kw):
    mask = _padding_mask(3, 17, 23, seed=num_pos_feats)
    theirs = detr_position_embedding_sine(mask, num_pos_feats, **kw)  # float32
    exact = detr_position_embedding_sine(mask, num_pos_feats, **kw, dtype=F64)
    ours = detr_sine_encoding(mask, num_pos_feats, **kw)
    assert ours.shape == theirs.shape == (3, 2 * num_pos_feats, 17, 23)
    assert ours.stride() == theirs.stride()  # channels first, DETR's memory layout
    closer = (ours.double() - exact).abs() <= (theirs.double() - exact).abs()
    assert ((ours == theirs) | closer).all()
    assert (ours.double() - exact).abs().max() <= 2**-24
    assert torch.isfinite(ours).all()


def test_detr_module_takes_a_mask_or_a_nested_tensor():
    class NestedTensor:
        def __init__(self, tensors, mask):
            self.tensors, self.mask = tensors, mask

    mask = _padding_mask(2, 9, 11, seed=0)
    sine = PositionEmbeddingSine(32, normalize=True)
    assert sine.state_dict() == {} and not list(sine.buffers())
    expected = detr_sine_encoding(mask, 32, normalize=True)
    assert torch.equal(sine(mask), expected)
    assert torch.equal(sine(NestedTensor(torch.randn(2, 3, 9, 11), mask)), expected)
    assert sine(mask, dtype=F64).dtype == F64
    assert "num_pos_feats=32" in repr(sine)


def test_nerf_is_the_reference_with_doubling_frequencies():
    L = 10
    x = torch.rand(200, 3, dtype=F64) * 2 - 1
    e = _sincos(x, L, 1.0, 2.0 ** -(L - 1), False)  # omega_j = 2^j: [200, 3, 2L]
    by_freq = e.view(200, 3, 2, L).permute(0, 3, 2, 1).reshape(200, -1)
    theirs = nerf_embed(x, L, dtype=F64)
    assert torch.allclose(torch.cat([x, by_freq], -1), theirs, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------
# The modules
# ----------------------------------------------------------------------------------------------------------


def test_timesteps_module_holds_no_state():
    module = Timesteps(320, True, 0)  # diffusers' positional arguments
    assert not list(module.parameters()) and not list(module.buffers())
    assert module.state_dict() == {}
    t = torch.rand(16) * 1000
    expected = timestep_embedding(t, 320, flip_sin_to_cos=True, downscale_freq_shift=0)
    assert torch.equal(module(t), expected)
    assert module(t, dtype=F64).dtype == F64
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert torch.equal(clone(t), expected)
    text = repr(module)
    assert "num_channels=320" in text and "downscale_freq_shift=0" in text


def test_the_public_names():
    assert set(GRID_CONVENTIONS) == {
        "mae",
        "big_vision",
        "mocov3",
        "timm",
        "diffusers_3d",
    }
    for name in (
        "timestep_embedding",
        "sincos_grid",
        "detr_sine_encoding",
        "Timesteps",
        "PositionEmbeddingSine",
        "GRID_CONVENTIONS",
    ):
        assert name in posenc.__all__ and hasattr(posenc, name)


# ----------------------------------------------------------------------------------------------------------
# Bad inputs: a clear error naming the argument, the value and a fix
# ----------------------------------------------------------------------------------------------------------

T = torch.arange(4.0)
MASK = torch.zeros(1, 4, 4, dtype=torch.bool)
BAD = [
    # (call, error, fragments of the message)
    (lambda: timestep_embedding([1.0, 2.0], 8), TypeError, ["timesteps", "list", "torch.tensor"]),
    (lambda: timestep_embedding(torch.tensor([True]), 8), TypeError, ["timesteps", "torch.bool", "float()"]),
    (lambda: timestep_embedding(torch.tensor(3.0), 8), ValueError, ["timesteps", "()", "reshape"]),
    (lambda: timestep_embedding(torch.ones(2, 2), 8), ValueError, ["timesteps", "(2, 2)", "reshape"]),
    (lambda: timestep_embedding(torch.tensor([1.0, -2.0]), 8), ValueError, ["timesteps", "-2.0", "index 1"]),
    (lambda: timestep_embedding(torch.tensor([float("nan")]), 8), ValueError, ["timesteps", "nan", "index 0"]),
    (lambda: timestep_embedding(torch.tensor([float("inf")]), 8), ValueError, ["timesteps", "inf"]),
    (lambda: timestep_embedding(torch.tensor([-1]), 8), ValueError, ["timesteps", "-1"]),
    (lambda: timestep_embedding(T, 1), ValueError, ["dim", "1", "dim=256"]),
    (lambda: timestep_embedding(T, 2), ValueError, ["dim", "downscale_freq_shift", "dim=2", "downscale_freq_shift=0"]),
    (lambda: timestep_embedding(T, 8.0), TypeError, ["dim", "8.0", "dim=256"]),
    (lambda: timestep_embedding(T, 8, flip_sin_to_cos=1), TypeError, ["flip_sin_to_cos", "1"]),
    (lambda: timestep_embedding(T, 8, downscale_freq_shift=float("nan")), ValueError, ["downscale_freq_shift", "nan"]),
    (lambda: timestep_embedding(T, 8, scale=0), ValueError, ["scale", "0", "scale=1.0"]),
    (lambda: timestep_embedding(T, 8, max_period=1), ValueError, ["max_period", "1", "max_period=10000"]),
    (lambda: timestep_embedding(T, 8, dtype=torch.int64), TypeError, ["dtype", "torch.int64", "dtype=torch.float32"]),
    (lambda: sincos_grid(16, 64), TypeError, ["shape", "16", "(16, 16)"]),
    (lambda: sincos_grid((0, 4), 64), ValueError, ["shape", "(0, 4)", "axis 0", "size 0"]),
    (lambda: sincos_grid((4, 2.5), 64), TypeError, ["shape", "2.5", "axis 1"]),
    (lambda: sincos_grid((), 64), TypeError, ["shape", "()", "(16, 16)"]),
    (lambda: sincos_grid((4, 4), 30), ValueError, ["dim", "4", "30", "dim=32"]),
    (lambda: sincos_grid((4, 4), 4, convention="big_vision"), ValueError, ["dim", ">= 8", "dim=8"]),
    (lambda: sincos_grid((2, 4, 4), 40, convention="diffusers_3d"), ValueError, ["dim", "16", "40", "dim=48"]),
    (lambda: sincos_grid((4, 4), 64, convention="diffusers_3d"), ValueError, ["'diffusers_3d'", "3-D", "2-D"]),
    (lambda: sincos_grid((2, 4, 4), 48, convention="timm"), ValueError, ["'timm'", "2-D", "'mae'"]),
    (lambda: sincos_grid((4, 4), 64, convention="vit"), ValueError, ["convention", "'vit'", "'mae'"]),
    (lambda: sincos_grid((4, 4), 64, base=1.0), ValueError, ["base", "1.0", "base=10000.0"]),
    (lambda: sincos_grid((4, 4), 64, scale=(1.0,)), ValueError, ["scale", "2", "(1.0,)"]),
    (lambda: sincos_grid((4, 4), 64, scale=-1.0), ValueError, ["scale", "-1.0"]),
    (lambda: detr_sine_encoding(MASK.long()), TypeError, ["mask", "torch.int64", "pixel_mask == 0"]),
    (lambda: detr_sine_encoding(MASK[0]), ValueError, ["mask", "(4, 4)", "mask[None]"]),
    (lambda: detr_sine_encoding(MASK, 63), ValueError, ["num_pos_feats", "63", "64"]),
    (lambda: detr_sine_encoding(MASK, scale=1.0), ValueError, ["scale=1.0", "normalize=True"]),
    (lambda: detr_sine_encoding(MASK, normalize=True, eps=-1.0), ValueError, ["eps", "-1.0"]),
    (lambda: detr_sine_encoding(MASK, temperature=0.5), ValueError, ["temperature", "0.5"]),
    (lambda: Timesteps(1), ValueError, ["num_channels", "1", "num_channels=256"]),
    (lambda: PositionEmbeddingSine(64, scale=2.0), ValueError, ["scale=2.0", "normalize=True"]),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "fragments"), BAD)
def test_bad_inputs_get_a_clear_error(call, error, fragments):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_values_are_not_read_on_the_meta_device():
    # no value check where values are unknown (meta tensors, tracing)
    out = timestep_embedding(torch.empty(8, device="meta"), 16)
    assert out.shape == (8, 16) and out.device.type == "meta"
    assert math.isfinite(timestep_embedding(torch.tensor([0.0]), 16).sum().item())
