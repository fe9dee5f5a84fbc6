"""posenc.timestep_embedding, sincos_grid, detr_sine_encoding and their modules, with the package alone.

Checked against mpmath (float32 within 2^-24 of the exact values), against the recipes restated from their sources
in tests/references/sincos_peers.py (DDPM, ADM/DiT, MAE/DiT, MoCo v3, Big Vision, DETR, NeRF), and for the
structure the chapter (book/07_timesteps_and_grids.ipynb) and its reference page
(book/17_sincos_conventions.ipynb) derive: every grid convention a permutation or a schedule of one reference, the
shortcut for expanded time steps, the modules' empty state, every bad input; and what a training loop, a compiler
or an accelerator meets: every parameter at a non-default value against NumPy or mpmath, exact derivatives in half
precision, torch.compile and torch.vmap, peak memory within 1.5 times the result, no host synchronisation, and
DETR's two mask polarities. The installed diffusers, timm and transformers are compared in
tests/sincos/test_embeddings_peers.py (this file runs on the package's floor, without them).
"""

from __future__ import annotations

import copy
import math
import pickle
import weakref

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

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
from posenc.sincos.embeddings import _sincos
from posenc.sinusoidal.encoding import _round_once
from tests.references.exact import TIMESTEP_SETTINGS, exact_embedding
from tests.references.floors import needs_compile, needs_fake_accelerator
from tests.references.sincos_peers import (
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


def angles(t: torch.Tensor, dim: int, shift: float, base: float = 1e4) -> torch.Tensor:
    """The angle behind each channel of a time-step embedding: ``[N, dim]`` (0 for the zero channel)."""
    half = dim // 2
    omega = base ** (-torch.arange(half, dtype=F64) / (half - shift))
    theta = (t.double()[:, None] * omega).repeat(1, 2)
    return torch.nn.functional.pad(theta, (0, dim % 2))


# ----------------------------------------------------------------------------------------------------------
# timestep_embedding: precision
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("flip", "shift"), TIMESTEP_SETTINGS)
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
    half = {"layout": "half", "dtype": F64}
    by_col = sinusoidal_encoding(cols, d // 2, **half)
    by_row = sinusoidal_encoding(rows, d // 2, **half)
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
    t2t = {"layout": "half", "schedule": "tensor2tensor", "dtype": F64}
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
        sinusoidal_encoding(50, 64, layout="half", dtype=F64),
    )
    shape, d = (3, 4, 5), 96
    idx = _tokens(shape)
    mae = sincos_grid(shape, d, dtype=F64)  # the last axis first, d/3 each
    blocks = [
        sinusoidal_encoding(idx[:, a], 32, layout="half", dtype=F64) for a in (2, 1, 0)
    ]
    assert torch.equal(mae, torch.cat(blocks, -1))
    d = 64  # diffusers_3d: [frames (d/4) | columns (3d/8) | rows (3d/8)]
    cog = sincos_grid(shape, d, convention="diffusers_3d", dtype=F64)
    blocks = [
        sinusoidal_encoding(idx[:, 0], 16, layout="half", dtype=F64),
        sinusoidal_encoding(idx[:, 2], 24, layout="half", dtype=F64),
        sinusoidal_encoding(idx[:, 1], 24, layout="half", dtype=F64),
    ]
    assert torch.equal(cog, torch.cat(blocks, -1))


def test_grid_scale_divides_the_positions_per_axis():
    shape, d = (5, 8), 32
    idx = _tokens(shape).double()
    ours = sincos_grid(shape, d, interpolation_scale=(2.5, 0.75), dtype=F64)
    w = _sincos(idx[:, 1] / 0.75, 8, 0.0, 1e4, False)
    h = _sincos(idx[:, 0] / 2.5, 8, 0.0, 1e4, False)
    assert torch.equal(ours, torch.cat([w, h], -1))
    assert torch.equal(
        sincos_grid(shape, d, interpolation_scale=2.0, dtype=F64),
        sincos_grid(shape, d, interpolation_scale=(2.0, 2.0), dtype=F64),
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
    (
        lambda: sincos_grid((4, 4), 64, interpolation_scale=(1.0,)),
        ValueError,
        ["interpolation_scale", "2", "(1.0,)"],
    ),
    (
        lambda: sincos_grid((4, 4), 64, interpolation_scale=-1.0),
        ValueError,
        ["interpolation_scale", "-1.0"],
    ),
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


# ----------------------------------------------------------------------------------------------------------
# Every parameter at a valid non-default value, against an independent reference (NumPy or mpmath, not posenc)
# ----------------------------------------------------------------------------------------------------------


def _np_axis(pos: np.ndarray, m: int, shift: float, base: float) -> np.ndarray:
    """One axis's ``[sin | cos]`` in NumPy float64: ``[len(pos), 2m]``."""
    omega = base ** (-np.arange(m) / (m - shift))
    theta = np.outer(pos, omega)
    return np.concatenate([np.sin(theta), np.cos(theta)], axis=1)


def _np_grid(shape, dim, convention, base=1e4, divisors=None):
    """Each convention as its docstring states it, built from ``_np_axis``: ``[prod(shape), dim]``."""
    divisors = divisors or (1.0,) * len(shape)
    idx = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1)
    idx = idx.reshape(-1, len(shape)) / np.asarray(divisors)
    if convention in ("mae", "big_vision"):
        shift, m = (1.0 if convention == "big_vision" else 0.0), dim // (2 * len(shape))
        return np.concatenate(
            [_np_axis(idx[:, a], m, shift, base) for a in reversed(range(len(shape)))],
            1,
        )
    if convention == "mocov3":
        return np.concatenate(
            [_np_axis(idx[:, a], dim // 4, 0.0, base) for a in (0, 1)], 1
        )
    if convention == "timm":
        h, w = (_np_axis(idx[:, a], dim // 4, 0.0, base) for a in (0, 1))
        q = dim // 4
        return np.concatenate([h[:, :q], w[:, :q], h[:, q:], w[:, q:]], 1)
    t = _np_axis(idx[:, 0], dim // 8, 0.0, base)  # diffusers_3d: [t | w | h]
    return np.concatenate([t, _np_axis(idx[:, 2], 3 * dim // 16, 0.0, base),
                           _np_axis(idx[:, 1], 3 * dim // 16, 0.0, base)], 1)  # fmt: skip


@pytest.mark.parametrize(
    ("shape", "dim", "convention"),
    [((3, 5), 32, "mae"), ((2, 3, 4), 48, "mae"), ((3, 5), 32, "big_vision"),
     ((3, 5), 32, "mocov3"), ((3, 5), 32, "timm"), ((2, 3, 5), 64, "diffusers_3d")],
)  # fmt: skip
def test_every_grid_parameter_against_numpy(shape, dim, convention):
    bound = float64_bound(20.0, 1e4)
    # the defaults, then base, interpolation_scale (one per axis), base_size and dtype at other values
    ours = sincos_grid(shape, dim, convention=convention, dtype=F64)
    assert (ours.numpy() - _np_grid(shape, dim, convention)).__abs__().max() <= bound
    scales = tuple(0.5 + a for a in range(len(shape)))
    ours = sincos_grid(
        shape,
        dim,
        convention=convention,
        base=300.0,
        interpolation_scale=scales,
        dtype=F64,
    )
    theirs = _np_grid(shape, dim, convention, base=300.0, divisors=scales)
    assert np.abs(ours.numpy() - theirs).max() <= bound
    bases = tuple(
        4.0 * (a + 1) for a in range(len(shape))
    )  # positions span base_size / scale
    ours = sincos_grid(
        shape,
        dim,
        convention=convention,
        base_size=bases,
        interpolation_scale=2.0,
        dtype=F64,
    )
    divisors = tuple(2.0 * n / b for n, b in zip(shape, bases))
    assert (
        np.abs(ours.numpy() - _np_grid(shape, dim, convention, divisors=divisors)).max()
        <= bound
    )
    half = sincos_grid(shape, dim, convention=convention, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    assert (
        np.abs(half.double().numpy() - _np_grid(shape, dim, convention)).max() <= 2**-9
    )
    meta = sincos_grid(shape, dim, convention=convention, device="meta")
    assert meta.device.type == "meta" and meta.shape == (math.prod(shape), dim)


def test_the_old_grid_keyword_scale_still_divides_the_positions_and_warns():
    with pytest.warns(DeprecationWarning, match="interpolation_scale"):
        old = sincos_grid((4, 6), 32, scale=(2.5, 0.75), dtype=F64)
    assert torch.equal(
        old, sincos_grid((4, 6), 32, interpolation_scale=(2.5, 0.75), dtype=F64)
    )
    with pytest.raises(ValueError, match="interpolation_scale only"):
        sincos_grid((4, 6), 32, scale=2.0, interpolation_scale=3.0)


def test_timesteps_module_parameters_against_mpmath():
    t = torch.tensor([0.0, 1.5, 37.25, 999.0])
    module = Timesteps(
        20, flip_sin_to_cos=True, downscale_freq_shift=0.5, scale=3.0, max_period=500.0
    )
    exact = exact_embedding(t, 20, True, 0.5, 3.0, 500.0)
    assert (module(t).double() - exact).abs().max() <= 2**-24
    plain = Timesteps(
        20
    )  # every default: sines first, s = 1, scale 1, max_period 10000
    assert (
        plain(t).double() - exact_embedding(t, 20, False, 1.0, 1.0, 10000)
    ).abs().max() <= 2**-24


def _np_detr(
    image: np.ndarray,
    feats: int,
    temperature: float,
    normalize: bool,
    scale: float,
    eps: float,
):
    """DETR's sine encoding in NumPy float64 from an image mask (True on the image): ``[batch, 2F, h, w]``."""
    y, x = image.cumsum(1).astype(float), image.cumsum(2).astype(float)
    if normalize:
        y_end, x_end = y[:, -1:, :] + eps, x[:, :, -1:] + eps
        y = y / np.where(y_end > 0, y_end, 1.0) * scale
        x = x / np.where(x_end > 0, x_end, 1.0) * scale
    omega = temperature ** (-2.0 * np.arange(feats // 2) / feats)
    out = []
    for pos in (y, x):
        theta = pos[..., None] * omega
        out.append(
            np.stack([np.sin(theta), np.cos(theta)], -1).reshape(*pos.shape, feats)
        )
    return np.concatenate(out, -1).transpose(0, 3, 1, 2)


def test_position_embedding_sine_parameters_against_numpy():
    mask = _padding_mask(3, 9, 13, seed=5)
    image = (~mask).numpy()
    for kw in ({"temperature": 20.0}, {"normalize": True, "scale": 3.0}, {"normalize": True, "eps": 0.5},
               {"normalize": True, "temperature": 50.0, "scale": 1.0, "eps": 0.0}):  # fmt: skip
        module = PositionEmbeddingSine(
            16, **{k: v for k, v in kw.items() if k != "eps"}, eps=kw.get("eps", 1e-6)
        )
        theirs = _np_detr(image, 16, kw.get("temperature", 1e4), kw.get("normalize", False),
                          kw.get("scale", 2 * math.pi), kw.get("eps", 1e-6))  # fmt: skip
        assert np.abs(module(mask, dtype=F64).numpy() - theirs).max() <= 1e-12, kw


# ----------------------------------------------------------------------------------------------------------
# Derivatives, torch.func, compile: what a training loop or a sampler meets
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_derivative_with_respect_to_time_is_the_exact_one_in_every_dtype(dtype):
    t = torch.tensor([3.0, 250.5, 999.0], dtype=F64)
    omega = 1e4 ** (-torch.arange(4, dtype=F64) / 4)  # dim 8, s = 0
    theta = t[:, None] * omega
    exact = torch.cat(
        [-omega * theta.sin(), omega * theta.cos()], -1
    )  # d/dt of [cos | sin]
    kw = {"flip_sin_to_cos": True, "downscale_freq_shift": 0, "dtype": dtype}
    # backward, through the function and through the module
    module = Timesteps(8, True, 0)
    for embed in (
        lambda x: timestep_embedding(x, 8, **kw).double(),
        lambda x: module(x, dtype=dtype).double(),
    ):
        jac = torch.autograd.functional.jacobian(embed, t)  # [3, 8, 3]
        assert torch.allclose(
            torch.einsum("ncn->nc", jac), exact, rtol=1e-12, atol=1e-15
        )
    # forward mode, and torch.func.grad
    _, tangent = torch.func.jvp(
        lambda x: timestep_embedding(x, 8, **kw), (t,), (torch.ones(3, dtype=F64),)
    )
    assert tangent.dtype == dtype
    assert torch.allclose(tangent.double(), exact.to(dtype).double(), rtol=0, atol=0)
    grad = torch.func.grad(
        lambda x: timestep_embedding(x, 8, **kw)[:, 1].double().sum()
    )(t)
    assert torch.allclose(grad, exact[:, 1], rtol=1e-12, atol=1e-15)
    # the values are unchanged by the derivative's path
    assert torch.equal(
        timestep_embedding(t.requires_grad_(), 8, **kw).detach(),
        timestep_embedding(t.detach(), 8, **kw),
    )


def test_vmap_over_time_steps_gives_each_row():
    t = torch.rand(3, 5, dtype=F64) * 1000
    batched = torch.vmap(lambda x: timestep_embedding(x, 16, dtype=F64))(t)
    assert torch.equal(
        batched, torch.stack([timestep_embedding(row, 16, dtype=F64) for row in t])
    )


@needs_compile
def test_compile_fullgraph_dynamic_matches_eager():
    # dynamo traces the four builders whole (fullgraph) in one graph, with symbolic sizes and floats (dynamic): the
    # value checks must not read a symbolic number
    module = Timesteps(16, True, 0, 3.0)
    sine = PositionEmbeddingSine(8, normalize=True, scale=3.0)

    def build(t, mask, n, scale, max_period, interpolation_scale):
        return (
            timestep_embedding(t, 16, scale=scale, max_period=max_period),
            module(t),
            sine(mask),
            sincos_grid(
                (3, n), 16, interpolation_scale=interpolation_scale, base_size=8.0
            ),
        )

    args = (torch.rand(6) * 1000, _padding_mask(2, 5, 7, seed=1), 4, 2.5, 700.0, 0.5)
    compiled = torch.compile(build, fullgraph=True, dynamic=True, backend="eager")
    for ours, eager in zip(compiled(*args), build(*args)):
        assert torch.equal(ours, eager)


# ----------------------------------------------------------------------------------------------------------
# Inputs refused rather than a NaN, and dtypes refused with a TypeError
# ----------------------------------------------------------------------------------------------------------


def test_angles_or_positions_that_overflow_are_refused():
    with pytest.raises(ValueError, match="scale"):
        timestep_embedding(torch.tensor([2.0]), 8, scale=1e308)
    with pytest.raises(ValueError, match="interpolation_scale"):
        sincos_grid((3, 3), 8, interpolation_scale=1e-310)
    with pytest.raises(ValueError, match="overflow"), pytest.warns(DeprecationWarning):
        sincos_grid((3, 3), 8, scale=1e-310)
    # large but finite: a result, no NaN
    assert torch.isfinite(timestep_embedding(torch.tensor([2.0]), 8, scale=1e300)).all()


def test_detr_fully_padded_columns_get_position_zero_for_any_eps():
    mask = torch.zeros(1, 4, 6, dtype=torch.bool)
    mask[:, :, 4:] = True  # two fully padded columns (and rows of width 4)
    for eps in (0.0, 1e-6):
        out = detr_sine_encoding(mask, 8, normalize=True, eps=eps, dtype=F64)
        assert torch.isfinite(out).all()
        y = out[0, :4, :, 4:]  # the y channels of the padded columns: sin 0, cos 0, ...
        assert torch.equal(y[0::2], torch.zeros_like(y[0::2])) and torch.equal(
            y[1::2], torch.ones_like(y[1::2])
        )


@pytest.mark.parametrize("shape", [(0, 4, 6), (2, 0, 6), (2, 4, 0), (0, 0, 0)])
@pytest.mark.parametrize("normalize", [False, True])
def test_detr_masks_with_an_axis_of_size_0_give_the_empty_result(shape, normalize):
    # as every other function: an empty input gives the empty result of its shape
    batch, height, width = shape
    expected = (batch, 16, height, width)
    mask = torch.zeros(shape, dtype=torch.bool)
    out = detr_sine_encoding(mask, 8, normalize=normalize, dtype=F64)
    assert out.shape == expected and out.dtype == F64
    hf = detr_sine_encoding(
        pixel_mask=torch.ones(shape, dtype=torch.long), num_pos_feats=8
    )
    assert hf.shape == expected and hf.dtype == torch.float32
    module = PositionEmbeddingSine(8, normalize=normalize)
    assert module(mask).shape == expected


def test_unsupported_time_step_dtypes_get_a_type_error():
    names = ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")
    for dtype in [getattr(torch, n) for n in names if hasattr(torch, n)]:
        with pytest.raises(TypeError, match=f"{dtype}.*long"):
            timestep_embedding(torch.tensor([1, 2]).to(dtype), 8)
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.float16, torch.bfloat16):
        assert torch.equal(
            timestep_embedding(torch.tensor([1, 2]).to(dtype), 8),
            timestep_embedding(torch.tensor([1.0, 2.0]), 8),
        )


# ----------------------------------------------------------------------------------------------------------
# DETR's two masks
# ----------------------------------------------------------------------------------------------------------


def test_detr_takes_either_mask_by_its_name():
    mask = _padding_mask(3, 7, 9, seed=2)
    expected = detr_sine_encoding(mask, 16, normalize=True)
    for pixel_mask in (~mask, (~mask).long(), (~mask).float()):
        assert torch.equal(
            detr_sine_encoding(pixel_mask=pixel_mask, num_pos_feats=16, normalize=True),
            expected,
        )
        assert torch.equal(
            PositionEmbeddingSine(16, normalize=True)(pixel_mask=pixel_mask), expected
        )
    with pytest.raises(TypeError, match="exactly one"):
        detr_sine_encoding(mask, pixel_mask=~mask)
    with pytest.raises(TypeError, match="exactly one"):
        detr_sine_encoding()


def test_a_mask_of_the_other_polarity_is_refused():
    # DETR's: True on padding, the image at the top left
    mask = _padding_mask(3, 7, 9, seed=2)
    with pytest.raises(ValueError, match=r"other polarity.*pixel_mask="):
        detr_sine_encoding(~mask)  # a Hugging Face mask passed as DETR's
    with pytest.raises(ValueError, match=r"other polarity.*mask="):
        detr_sine_encoding(pixel_mask=mask)  # DETR's passed as Hugging Face's
    unpadded = torch.ones(2, 5, 5, dtype=torch.bool)  # Hugging Face's, no padding
    with pytest.raises(ValueError, match="no image anywhere"):
        PositionEmbeddingSine(8)(unpadded)
    with pytest.raises(ValueError, match=r"0 .padding. and 1"):
        detr_sine_encoding(pixel_mask=torch.full((1, 3, 3), 0.5))


# ----------------------------------------------------------------------------------------------------------
# Memory, chunks and host synchronisations
# ----------------------------------------------------------------------------------------------------------


class _Allocations(TorchDispatchMode):
    """Torch's allocations while active, as tracemalloc counts Python's: each new storage an operation returns is
    live until its last reference goes (a finalizer on the storage, which torch keeps as long as the memory), and
    ``peak`` is the most bytes live at once. Temporaries inside a single ATen kernel are not seen."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.bytes = self.peak = 0

    def _free(self, key: int) -> None:
        self.bytes -= self.live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if (
                isinstance(t, torch.Tensor)
                and t.untyped_storage().data_ptr() not in self.live
            ):
                storage = t.untyped_storage()
                if storage.data_ptr():
                    self.live[storage.data_ptr()] = storage.nbytes()
                    self.bytes += storage.nbytes()
                    self.peak = max(self.peak, self.bytes)
                    weakref.finalize(storage, self._free, storage.data_ptr())
        return out


def _peak_bytes(fn) -> tuple[int, torch.Tensor]:
    """The peak of torch's allocations while ``fn`` runs, and its result."""
    with _Allocations() as allocations:
        out = fn()
    return allocations.peak, out


def test_every_table_build_peaks_within_one_and_a_half_times_its_result(monkeypatch):
    import posenc.sinusoidal.encoding

    # small tables, built as a large one would be
    monkeypatch.setattr(posenc.sinusoidal.encoding, "CHUNK_BYTES", 2**15, raising=False)
    t = torch.rand(512) * 1000
    mask = torch.zeros(2, 32, 16, dtype=torch.bool)
    mask[1, 20:] = True
    builds = {
        "timestep bf16": lambda: timestep_embedding(t, 256, dtype=torch.bfloat16),
        "timestep float32": lambda: timestep_embedding(t, 256),
        "grid 1-d bf16": lambda: sincos_grid((1024,), 128, dtype=torch.bfloat16),
        "grid 2-d float32": lambda: sincos_grid((32, 32), 128),
        "detr float32": lambda: detr_sine_encoding(mask, 64, normalize=True),
        "detr bf16": lambda: detr_sine_encoding(
            mask, 64, normalize=True, dtype=torch.bfloat16
        ),
    }
    for name, build in builds.items():
        peak, out = _peak_bytes(build)
        assert peak <= 1.5 * out.numel() * out.element_size(), (
            name,
            peak / (out.numel() * out.element_size()),
        )


def test_chunks_give_the_bits_of_one_block(monkeypatch):
    import posenc.sinusoidal.encoding

    t = torch.rand(300) * 1000
    mask = _padding_mask(3, 11, 9, seed=3)
    builds = [
        lambda: timestep_embedding(t, 65, dtype=torch.bfloat16),
        lambda: timestep_embedding(t, 64, flip_sin_to_cos=True, downscale_freq_shift=0),
        lambda: sincos_grid((40, 3), 32, convention="timm", dtype=torch.float16),
        lambda: sincos_grid((5, 6, 7), 48, convention="diffusers_3d"),
        lambda: detr_sine_encoding(mask, 16, normalize=True),
    ]
    whole = [build() for build in builds]
    monkeypatch.setattr(
        posenc.sinusoidal.encoding, "CHUNK_BYTES", 2**10
    )  # a few rows per chunk
    for build, expected in zip(builds, whole):
        assert torch.equal(build(), expected)
    # a time step batch of 256 x 320 (the benchmark's) is one chunk at the default
    monkeypatch.undo()
    assert len(posenc.sinusoidal.encoding._row_ranges(256, 320, 256 * 320 * 4)) == 1


@needs_fake_accelerator
def test_no_host_synchronisation_on_an_accelerator():
    from tests.references.host_syncs import DEVICE, host_syncs

    steps = lambda: torch.rand(8, device=DEVICE) * 1000  # noqa: E731
    mask = lambda: torch.zeros(2, 5, 7, dtype=torch.bool, device=DEVICE)  # noqa: E731
    calls = {
        "timestep_embedding": (
            lambda x: timestep_embedding(x, 32, scale=2.0, dtype=torch.bfloat16),
            steps,
        ),
        "expanded": (lambda x: timestep_embedding(x[:1].expand(8), 32), steps),
        "Timesteps": (Timesteps(32, True, 0), steps),
        "sincos_grid": (lambda d: sincos_grid((4, 6), 32, device=d), lambda: DEVICE),
        "detr_sine_encoding": (
            lambda m: detr_sine_encoding(m, 8, normalize=True),
            mask,
        ),
        "PositionEmbeddingSine": (PositionEmbeddingSine(8, normalize=True), mask),
        "base_size": (
            lambda d: sincos_grid((4, 6), 32, base_size=16, device=d),
            lambda: DEVICE,
        ),
        "pixel_mask": (
            lambda m: detr_sine_encoding(pixel_mask=m.long(), num_pos_feats=8),
            mask,
        ),
    }
    for name, (fn, make) in calls.items():
        assert host_syncs(fn, make) == [], name
    # the checks that read values still run on real CPU tensors
    with pytest.raises(ValueError, match="nan"):
        timestep_embedding(torch.tensor([float("nan")]), 8)


def test_ddpm_s_float32_recipe_drifts_past_1e_5_near_t_1000():
    # chapter 07: "the float32 recipe drifts in proportion to t, past 1e-5 near t = 1000"
    t = torch.arange(900, 1000.0)
    error = (
        (
            ddpm_get_timestep_embedding(t, 320).double()
            - timestep_embedding(t, 320, dtype=F64)
        )
        .abs()
        .max()
    )
    early = (
        (
            ddpm_get_timestep_embedding(t / 100, 320).double()
            - timestep_embedding(t / 100, 320, dtype=F64)
        )
        .abs()
        .max()
    )
    assert 1e-5 < error < 1e-3 and early < error
