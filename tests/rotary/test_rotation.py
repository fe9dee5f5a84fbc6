"""Rotary position embeddings (book/06_rotary.ipynb): tables, rotation, module, peers, precision, compile, export.

Bounds (derived in the chapter):

- tables: float64 within ``2**-50 * (1 + p / s)`` of NumPy's (s: a linear scaling factor); float32 within
  ``2**-24`` of the exact value for every position below ``2**24``; float16/bfloat16 equal to the float64 values
  rounded once.
- rotation, float64: within ``2**-53 * (p + 8) * |pair|`` of NumPy's float64 rotation (angle rounding, then the
  sine, cosine, two products and a sum).
- rotation, float32: within ``(2 + 1/sqrt(2)) * 2**-24 * |pair|`` of the exact rotation, plus the float64
  reference's own error; so <= 1e-6 for pairs of norm <= 6, at every position below ``2**20``.
- rotation, float16/bfloat16: within half a unit in the last place of the dtype (at the exact value's magnitude
  plus the float32 error) plus the float32 bound.
- the relative-score identity ``<R_m q, R_n k> == <R_(m+s) q, R_(n+s) k>`` in float64 to
  ``2**-53 * (m + n + (m+s) + (n+s) + 16 + 2 d) * |q| |k|``.

Meta's Llama code (restated in tests/references/rotary_peers.py: not installable) is reproduced from its own tables
and to its float32 angle drift (``2**-22 * p`` per unit of pair norm, plus roundings) from positions. This file
imports only torch, NumPy, hypothesis, mpmath and posenc (tools/floor_check.py runs it on the torch floor); the
comparisons with the installed transformers, diffusers, timm and rotary-embedding-torch are in
tests/rotary/test_rotation_peers.py.

Changed with issue 18 (the API changed on purpose): ``scale=`` became ``scaling={"rope_type": "linear", "factor":
s}`` (frequencies divided by s, as transformers does: bitwise the old result for powers of two); the tests of the
internal fast paths (``_common_case``, ``_rotate_given_tables``), which are gone, now check that every call gives
the bits of the one remaining path; the peers that install moved to tests/rotary/test_rotation_peers.py.
"""

from __future__ import annotations

import ast
import copy
import math
import os
import pickle
import re

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from posenc import (
    ROPE_TYPES,
    RotaryEmbedding,
    apply_rotary,
    frequencies,
    offset_matrix,
    rotary_cos_sin,
    rotary_frequencies,
)
from posenc.sinusoidal.encoding import _round_once
from tests.references import rotary_peers as peers
from tests.references.compiled import recording_backend
from tests.references.floors import needs_compile, needs_export

U32, U64 = 2.0**-24, 2.0**-53
FLOAT32_FACTOR = 2 + 1 / math.sqrt(
    2
)  # (2 + 1/sqrt 2) u |pair|: the float32 rotation bound
HALF = (torch.float16, torch.bfloat16)
SETTINGS = settings(max_examples=40, deadline=None, database=None)
layouts = st.sampled_from(["interleaved", "half"])
bases = st.floats(1.0, 6.0).map(lambda e: 10.0**e)  # log-uniform in [10, 1e6]


def even(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo // 2, hi // 2).map(lambda n: 2 * n)


def to_half_layout(x: torch.Tensor) -> torch.Tensor:
    """Channels of an interleaved head ``[..., d]`` reordered to the split-halves layout (one permutation)."""
    d = x.shape[-1]
    perm = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
    return x[..., perm]


def float64_bound(
    positions: torch.Tensor, x: torch.Tensor, layout: str = "interleaved"
) -> torch.Tensor:
    """Per-element bound of the float64 rotation against NumPy's: ``2**-53 (p + 8) |pair|`` (+ the reference's)."""
    p = positions.double()
    if p.dim() == 2:
        p = p.reshape(p.shape[0], *([1] * (x.dim() - 3)), p.shape[1])
    return 2 * U64 * (p.unsqueeze(-1) + 8) * peers.pair_norms(x, layout=layout) + 1e-300


def float32_bound(
    x: torch.Tensor,
    positions_max: int,
    rotary_dim: int | None = None,
    layout: str = "interleaved",
):
    """``(2 + 1/sqrt 2) u |pair|`` plus the float64 reference's own error (angles rounded in float64)."""
    norms = peers.pair_norms(x, rotary_dim, layout)
    return FLOAT32_FACTOR * U32 * norms + 4 * U64 * (positions_max + 8) * norms


# ----------------------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------------------


def numpy_angles(
    positions: torch.Tensor, r: int, base: float = 1e4, factor: float = 1.0
) -> np.ndarray:
    omega = np.power(base, -2.0 * np.arange(r // 2) / r) / factor  # linear: omega / s
    return positions.numpy().astype(np.float64)[..., None] * omega


@SETTINGS
@given(
    head_dim=even(2, 256),
    base=bases,
    factor=st.sampled_from([1.0, 0.5, 4.0, 16.0, 3.0]),
    positions=st.lists(st.integers(0, 2**20), min_size=1, max_size=12),
    layout=layouts,
)
def test_float64_tables_match_numpy(head_dim, base, factor, positions, layout):
    p = torch.tensor(positions)
    cos, sin = rotary_cos_sin(
        p, head_dim, base=base, dtype=torch.float64, layout=layout,
        scaling={"rope_type": "linear", "factor": factor},
    )  # fmt: skip
    assert cos.shape == sin.shape == (len(positions), head_dim)
    theta = numpy_angles(p, head_dim, base, factor)
    c, s = np.cos(theta), np.sin(theta)
    if layout == "interleaved":
        c, s = np.repeat(c, 2, axis=-1), np.repeat(s, 2, axis=-1)
    else:
        c, s = np.concatenate((c, c), -1), np.concatenate((s, s), -1)
    atol = 2.0**-50 * (1 + max(positions) / factor)
    np.testing.assert_allclose(cos.numpy(), c, rtol=0, atol=atol)
    np.testing.assert_allclose(sin.numpy(), s, rtol=0, atol=atol)


def test_float32_tables_within_2_pow_minus_24_below_2_pow_24():
    torch.manual_seed(0)
    p = torch.cat(
        [
            torch.arange(0, 2048),
            torch.randint(2048, 2**24, (4000,)),
            torch.tensor([2**24 - 1]),
        ]
    )
    cos, sin = rotary_cos_sin(p, 128)
    cos64, sin64 = rotary_cos_sin(p, 128, dtype=torch.float64)
    # float64 tables are within 2**-53 * 2**24 = 2**-29 of exact; rounding adds at most 2**-25
    assert (cos.double() - cos64).abs().max().item() <= 2.0**-25
    assert (sin.double() - sin64).abs().max().item() <= 2.0**-25
    theta = numpy_angles(p, 128)
    exact_err = np.abs(np.repeat(np.cos(theta), 2, -1) - cos.double().numpy()).max()
    assert exact_err <= U32


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_tables_are_float64_rounded_once(dtype):
    p = torch.cat(
        [
            torch.arange(0, 4096),
            torch.randint(
                4096, 2**20, (2000,), generator=torch.Generator().manual_seed(1)
            ),
        ]
    )
    for layout in ("interleaved", "half"):
        cos, sin = rotary_cos_sin(p, 64, dtype=dtype, layout=layout)
        cos64, sin64 = rotary_cos_sin(p, 64, dtype=torch.float64, layout=layout)
        assert cos.dtype == dtype
        assert torch.equal(cos, _round_once(cos64, dtype)) and torch.equal(
            sin, _round_once(sin64, dtype)
        )
    if (
        dtype == torch.float16
    ):  # NumPy's float64 -> float16 conversion rounds once: an independent check
        assert np.array_equal(cos.numpy(), cos64.numpy().astype(np.float16))


def test_table_shapes_devices_and_counts():
    cos, _ = rotary_cos_sin(10, 16, rotary_dim=8)
    assert (
        cos.shape == (10, 8) and cos.dtype == torch.float32 and cos.device.type == "cpu"
    )
    c2, _ = rotary_cos_sin(torch.arange(10), 16, rotary_dim=8)
    assert torch.equal(cos, c2)
    c3, _ = rotary_cos_sin(torch.arange(12).view(3, 4), 16)
    assert c3.shape == (3, 4, 16)
    c0, _ = rotary_cos_sin(0, 16)
    assert c0.shape == (0, 16)
    assert torch.equal(rotary_cos_sin(1, 8)[0], torch.ones(1, 8)) and torch.equal(
        rotary_cos_sin(1, 8)[1], torch.zeros(1, 8)
    )


@SETTINGS
@given(
    head_dim=even(2, 128),
    positions=st.lists(st.integers(0, 2**20), min_size=1, max_size=8),
)
def test_layouts_are_one_permutation_of_each_other(head_dim, positions):
    p = torch.tensor(positions)
    ci, si = rotary_cos_sin(p, head_dim, layout="interleaved")
    ch, sh = rotary_cos_sin(p, head_dim, layout="half")
    assert torch.equal(to_half_layout(ci), ch) and torch.equal(to_half_layout(si), sh)
    x = torch.randn(
        2,
        3,
        len(positions),
        head_dim,
        generator=torch.Generator().manual_seed(head_dim),
    )
    yi = apply_rotary(x, p, layout="interleaved")
    yh = apply_rotary(to_half_layout(x), p, layout="half")
    assert torch.equal(
        to_half_layout(yi), yh
    )  # the same arithmetic on permuted channels: bitwise


def test_checkpoint_weight_permutation_converts_between_layouts():
    """Meta's interleaved W_q, W_k -> split-halves, as Hugging Face's convert_llama_weights_to_hf.py ``permute``
    does (view(heads, d/2, 2, dim).transpose(1, 2)): the attention scores are unchanged."""
    torch.manual_seed(0)
    heads, head_dim, dim, seq = 4, 16, 32, 9
    w_q, w_k = (
        torch.randn(heads * head_dim, dim, dtype=torch.float64),
        torch.randn(heads * head_dim, dim, dtype=torch.float64),
    )

    def permute(w: torch.Tensor) -> torch.Tensor:
        return (
            w.view(heads, head_dim // 2, 2, dim)
            .transpose(1, 2)
            .reshape(heads * head_dim, dim)
        )

    x = torch.randn(1, seq, dim, dtype=torch.float64)

    def scores(wq, wk, layout):
        q = (x @ wq.T).view(1, seq, heads, head_dim).transpose(1, 2)
        k = (x @ wk.T).view(1, seq, heads, head_dim).transpose(1, 2)
        q, k = apply_rotary(q, layout=layout), apply_rotary(k, layout=layout)
        return q @ k.transpose(-1, -2)

    torch.testing.assert_close(
        scores(permute(w_q), permute(w_k), "half"),
        scores(w_q, w_k, "interleaved"),
        rtol=1e-13,
        atol=1e-12,
    )


# ----------------------------------------------------------------------------------------------------------
# The rotation: float64 properties
# ----------------------------------------------------------------------------------------------------------


@SETTINGS
@given(
    head_dim=even(2, 128),
    layout=layouts,
    base=bases,
    positions=st.lists(st.integers(0, 2**20), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_float64_rotation_matches_numpy(head_dim, layout, base, positions, seed):
    p = torch.tensor(positions)
    x = torch.randn(
        2,
        len(positions),
        head_dim,
        dtype=torch.float64,
        generator=torch.Generator().manual_seed(seed),
    )
    y = apply_rotary(x, p, layout=layout, base=base)
    ref = torch.from_numpy(peers.numpy_rotation(x, p, layout=layout, base=base))
    assert ((y - ref).abs() <= float64_bound(p, x, layout)).all()


def test_rotation_is_offset_matrix_of_minus_p():
    """Chapter 03's M_k rotates (sin, cos) clockwise; RoPE turns each pair counterclockwise: R_p = M_(-p) = M_p^T."""
    torch.manual_seed(0)
    x = torch.randn(50, 32, dtype=torch.float64)
    p = torch.randint(0, 2**20, (50,))
    m = offset_matrix(-p, 32)  # [50, 32, 32]
    torch.testing.assert_close(
        apply_rotary(x, p), (m @ x[..., None])[..., 0], rtol=0, atol=8 * U64 * 6
    )


@SETTINGS
@given(
    head_dim=even(2, 128),
    layout=layouts,
    m=st.integers(0, 2**20),
    n=st.integers(0, 2**20),
    shift=st.integers(0, 2**20),
    seed=st.integers(0, 2**16),
)
def test_relative_score_identity(head_dim, layout, m, n, shift, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (
        torch.randn(1, head_dim, dtype=torch.float64, generator=g),
        torch.randn(1, head_dim, dtype=torch.float64, generator=g),
    )

    def score(a: int, b: int) -> float:
        return (
            apply_rotary(q, a, layout=layout) @ apply_rotary(k, b, layout=layout).T
        ).item()

    bound = (
        U64
        * (m + n + (m + shift) + (n + shift) + 16 + 2 * head_dim)
        * q.norm().item()
        * k.norm().item()
    )
    assert abs(score(m, n) - score(m + shift, n + shift)) <= bound
    # and it is the score of the unrotated query with the key turned by n - m: <R_m q, R_n k> = <q, R_(n-m) k>
    if n >= m:
        assert (
            abs(score(m, n) - (q @ apply_rotary(k, n - m, layout=layout).T).item())
            <= bound
        )


@SETTINGS
@given(
    head_dim=even(2, 128),
    layout=layouts,
    a=st.integers(0, 2**19),
    b=st.integers(0, 2**19),
)
def test_orthogonality_and_group_structure(head_dim, layout, a, b):
    x = torch.randn(
        3,
        1,
        head_dim,
        dtype=torch.float64,
        generator=torch.Generator().manual_seed(a % 1000),
    )
    ra = apply_rotary(x, a, layout=layout)
    tol = U64 * (2 * (a + b) + 32) * x.norm(dim=-1, keepdim=True)
    assert (
        (ra.norm(dim=-1, keepdim=True) - x.norm(dim=-1, keepdim=True)).abs()
        <= 8 * U64 * x.norm(dim=-1, keepdim=True)
    ).all()
    assert (
        (
            apply_rotary(ra, b, layout=layout) - apply_rotary(x, a + b, layout=layout)
        ).abs()
        <= tol
    ).all()
    assert torch.equal(apply_rotary(x, 0, layout=layout), x)  # R_0 = I, bitwise


def test_attention_through_sdpa_depends_on_offsets_only():
    """Shifting every position by s leaves F.scaled_dot_product_attention's output unchanged (float64)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 12, 32, dtype=torch.float64) for _ in range(3))
    rope = RotaryEmbedding(32, max_len=64)
    out = nn.functional.scaled_dot_product_attention(*rope(q, k), v, is_causal=True)
    for shift in (1, 1000, 2**20):
        shifted = nn.functional.scaled_dot_product_attention(
            *rope(q, k, offset=shift), v, is_causal=True
        )
        torch.testing.assert_close(
            shifted, out, rtol=0, atol=2e-9 * (1 + shift / 2**10)
        )


def test_partial_rotary_leaves_the_other_channels_bitwise():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 64)
    for layout in ("interleaved", "half"):
        y = apply_rotary(x, 100, rotary_dim=24, layout=layout)
        assert torch.equal(y[..., 24:], x[..., 24:])
        assert torch.equal(
            y[..., :24], apply_rotary(x[..., :24].contiguous(), 100, layout=layout)
        )


# ----------------------------------------------------------------------------------------------------------
# Precision: float32 and half, against the float64 NumPy rotation; the peers' drift
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_float32_rotation_within_bound_below_2_pow_20(layout):
    g = torch.Generator().manual_seed(3)
    p = torch.cat(
        [
            torch.arange(0, 512),
            torch.randint(512, 2**20, (1536,), generator=g),
            torch.tensor([2**20 - 1]),
        ]
    )
    x = torch.randn(2, 2, len(p), 128, generator=g)
    y = apply_rotary(x, p, layout=layout)
    ref = torch.from_numpy(peers.numpy_rotation(x, p, layout=layout))
    err = (y.double() - ref).abs()
    assert (err <= float32_bound(x, 2**20, layout=layout)).all()
    assert peers.pair_norms(x, layout=layout).max() <= 6 and err.max() <= 1e-6


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_rotation_within_one_rounding(dtype):
    g = torch.Generator().manual_seed(4)
    p = torch.cat(
        [torch.arange(0, 256), torch.randint(256, 2**20, (768,), generator=g)]
    )
    x = torch.randn(2, 2, len(p), 64, generator=g).to(dtype)
    y = apply_rotary(x, p)
    assert y.dtype == dtype
    ref = torch.from_numpy(peers.numpy_rotation(x, p))
    e32 = float32_bound(x, 2**20)
    finfo = torch.finfo(dtype)
    # half a unit in the last place at the magnitude |y*| + e32 (power of two at or below it), subnormals included
    mag = (ref.abs() + e32).clamp_min(finfo.smallest_normal)
    half_ulp = 2.0 ** torch.floor(torch.log2(mag)) * finfo.eps / 2
    err = (y.double() - ref).abs()
    assert (err <= half_ulp + e32).all()
    correctly_rounded = (y == _round_once(ref, dtype)).double().mean().item()
    assert correctly_rounded >= 0.99


def test_half_precision_angle_recipes_are_off_by_order_one():
    # gpt-neox issue 1003: float16 angles, seq_len 2048, dim 32: position 1857, channel 1
    cos16, _ = peers.half_angle_cos_sin(2048, 32, torch.float16)
    cos64, _ = rotary_cos_sin(2048, 32, dtype=torch.float64, layout="half")
    assert abs(cos16[1857, 1].double() - cos64[1857, 1]).item() > 0.5
    ours16, _ = rotary_cos_sin(2048, 32, dtype=torch.float16, layout="half")
    assert (
        ours16.double() - cos64
    ).abs().max().item() <= 2.0**-12  # half an ulp of float16 below 1
    # bfloat16 positions are exact only up to 256: 257 is stored as 256
    assert torch.arange(260).to(torch.bfloat16)[257].item() == 256
    cos_bf, _ = peers.half_angle_cos_sin(4096, 32, torch.bfloat16)
    cos64, _ = rotary_cos_sin(4096, 32, dtype=torch.float64, layout="half")
    assert (cos_bf.double() - cos64).abs().max().item() > 1.0


# ----------------------------------------------------------------------------------------------------------
# The peers, reproduced
# ----------------------------------------------------------------------------------------------------------


def drift_tolerance(
    x: torch.Tensor,
    p_max: int,
    rotary_dim: int | None = None,
    layout: str = "interleaved",
):
    """|posenc - peer| for a float32 peer that forms angles in float32: its angle is off by <= 2**-22 * theta
    (inv_freq rounded, product rounded), its sine and cosine by 2**-24, so a pair moves by <= (2**-22 p + 2**-22)
    |pair|; both sides add the float32 rotation's roundings."""
    norms = peers.pair_norms(x, rotary_dim, layout)
    return (2.0**-22 * (p_max + 1) + 3 * FLOAT32_FACTOR * U32) * norms + 1e-30


def test_llama_complex_formulation_with_its_own_tables():
    torch.manual_seed(8)
    x = torch.randn(2, 4, 20, 64)
    freqs_cis = peers.llama_precompute_freqs_cis(64, 40)[15:35]
    cos, sin = (
        freqs_cis.real.repeat_interleave(2, -1),
        freqs_cis.imag.repeat_interleave(2, -1),
    )
    expected = peers.llama_rope(x, start_pos=15)
    # complex multiplication rounds its products and sums in its own order (an FMA here or there): 2 ulps
    ours = apply_rotary(x, cos=cos, sin=sin)
    torch.testing.assert_close(
        ours,
        expected,
        rtol=0,
        atol=(2 * FLOAT32_FACTOR * U32 * peers.pair_norms(x)).max().item(),
    )


@pytest.mark.parametrize("offset", [0, 7, 3000])
@pytest.mark.parametrize("rotary_dim", [None, 32])
def test_llama_from_positions_agrees_to_its_float32_drift(offset, rotary_dim):
    # (the transformers and rotary-embedding-torch halves of this test are
    # in test_rotation_peers.py)
    torch.manual_seed(9)
    x = torch.randn(2, 4, 40, 64)
    p_max = offset + 39
    ours = apply_rotary(x, offset, rotary_dim=rotary_dim)
    if rotary_dim is None:  # the Llama code rotates every channel
        assert (
            (ours - peers.llama_rope(x, start_pos=offset)).abs()
            <= drift_tolerance(x, p_max)
        ).all()
    else:  # partial rotary: the first channels are a narrower head's rotation
        narrow = peers.llama_rope(x[..., :rotary_dim].contiguous(), start_pos=offset)
        tol = drift_tolerance(x[..., :rotary_dim], p_max)
        assert ((ours[..., :rotary_dim] - narrow).abs() <= tol).all()


def test_position_interpolation_at_scaled_positions_is_the_plain_rotation():
    # (against transformers' linear type: test_rotation_peers.py)
    torch.manual_seed(10)
    x = torch.randn(1, 2, 30, 64)
    p = torch.arange(5000, 5030)
    linear = {"rope_type": "linear", "factor": 4.0}
    # factor s (a power of two) at position s * p is the unscaled rotation at p: (4p)(w/4) = pw
    assert torch.equal(apply_rotary(x, p * 4, scaling=linear), apply_rotary(x, p))


# ----------------------------------------------------------------------------------------------------------
# The module: cache, decoding, packing, GQA, dtypes, state
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_module_equals_apply_rotary_bitwise(layout):
    torch.manual_seed(11)
    rope = RotaryEmbedding(64, layout=layout, rotary_dim=48, max_len=32, base=5e5)
    q, k = torch.randn(2, 8, 10, 64), torch.randn(2, 2, 10, 64)
    for offset in (0, 5, 22, 40):  # cached, cached, crossing max_len, past it
        rq, rk = rope(q, k, offset=offset)
        kw = {"layout": layout, "rotary_dim": 48, "base": 5e5}
        assert torch.equal(rq, apply_rotary(q, offset, **kw)) and torch.equal(
            rk, apply_rotary(k, offset, **kw)
        )


def plain_rotation(
    x: torch.Tensor, positions: torch.Tensor, layout: str, rotary_dim=None, base=1e4
) -> torch.Tensor:
    """x * cos + rotate(x) * sin in x's dtype, from the float64 cos and sin of p * omega_i rounded once to it, in
    the order of operations every rotary recipe uses (transformers' apply_rotary_pos_emb): the reference that pins
    posenc's float32 and float64 rotations bit for bit (the experiment of chapter 08 trains with them)."""
    r = rotary_dim or x.shape[-1]
    theta = positions.double()[..., None] * frequencies(r, base=base)  # [..., r/2]
    cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
    xr = x[..., :r]
    if layout == "interleaved":
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        turned = torch.stack((-xr[..., 1::2], xr[..., 0::2]), -1).flatten(-2)
    else:
        cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        turned = torch.cat((-xr[..., r // 2 :], xr[..., : r // 2]), -1)
    if positions.dim() == 2:  # [batch, seq_len]: one row per sequence, all heads
        cos, sin = cos[:, None], sin[:, None]
    return torch.cat((xr * cos + turned * sin, x[..., r:]), -1)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_rotations_are_bitwise_the_plain_formula(layout, dtype):
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(2, 4, 9, 32, generator=g, dtype=dtype) for _ in range(2))
    for rotary_dim in (None, 16):
        rope = RotaryEmbedding(
            32, layout=layout, rotary_dim=rotary_dim, max_len=16, base=5e5
        )
        kw = {"layout": layout, "rotary_dim": rotary_dim, "base": 5e5}
        for offset in (0, 5, 12, 3000):  # cached, cached, crossing max_len, past it
            want = plain_rotation(
                q, torch.arange(offset, offset + 9), layout, rotary_dim, 5e5
            )
            assert torch.equal(rope(q, k, offset=offset)[0], want)
            assert torch.equal(apply_rotary(q, offset, **kw), want)
        per = torch.randint(0, 2**20, (2, 9), generator=g)
        want = plain_rotation(k, per, layout, rotary_dim, 5e5)
        assert torch.equal(rope(q, k, positions=per)[1], want)
        assert torch.equal(apply_rotary(k, per, **kw), want)
        assert torch.equal(
            rope.rotate(k.transpose(1, 2), positions=per, seq_dim=-3),
            want.transpose(1, 2),
        )


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_output_layouts_are_pinned(layout):
    """The memory layout of forward's outputs, which the attention's matmuls then read (a matmul may round
    differently on another layout: chapter 08's experiment reproduces bit for bit only with these): q and k of
    one shape and at most 2**16 elements each are rotated stacked, two contiguous halves of one tensor; larger
    ones keep q's layout (here [batch, seq_len, heads, head_dim] in memory, as split from a qkv projection)."""
    rope = RotaryEmbedding(16, layout=layout)
    for batch, seq_len, stacked in ((2, 8, True), (128, 40, False)):
        qkv = torch.randn(batch, seq_len, 3, 4, 16).permute(2, 0, 3, 1, 4)
        for kwargs in (
            {"offset": 3},
            {"positions": torch.arange(seq_len).expand(batch, -1)},
        ):
            rq, rk = rope(qkv[0], qkv[1], **kwargs)
            if stacked:
                assert rq.is_contiguous() and rk.is_contiguous()
                assert rk.data_ptr() - rq.data_ptr() == rq.numel() * rq.element_size()
            else:
                assert rq.stride() == rk.stride() == torch.empty_like(qkv[0]).stride()
            plain = plain_rotation(qkv[0], torch.arange(3, 3 + seq_len), layout)
            assert "positions" in kwargs or torch.equal(rq, plain)


@pytest.mark.parametrize("max_len", [8, 64])
def test_decoding_token_by_token_is_bitwise_the_full_forward(max_len):
    torch.manual_seed(12)
    rope = RotaryEmbedding(32, max_len=max_len)
    q, k = torch.randn(1, 4, 20, 32), torch.randn(1, 4, 20, 32)
    fq, fk = rope(q, k)
    for t in range(20):
        sq, sk = rope(q[:, :, t : t + 1], k[:, :, t : t + 1], offset=t)
        assert torch.equal(sq, fq[:, :, t : t + 1]) and torch.equal(
            sk, fk[:, :, t : t + 1]
        )


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("rotary_dim", [None, 12])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(
    "shape", [(1, 4, 1, 16), (2, 4, 6, 16), (3, 16), (2, 64, 33, 16), (0, 4, 1, 16)]
)
def test_module_branches_are_bitwise_apply_rotary(layout, rotary_dim, dtype, shape):
    # forward() slices its cached table, or computes rows past it ((0, ...) is
    # empty): every branch gives apply_rotary's bits
    torch.manual_seed(14)
    rope = RotaryEmbedding(16, layout=layout, rotary_dim=rotary_dim, max_len=64)
    q, k = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    kw = {"layout": layout, "rotary_dim": rotary_dim}
    for offset in (0, 5, 64 - shape[-2], 64 - shape[-2] + 1, 1000):
        out = rope(q, k, offset=offset)
        assert torch.equal(out[0], apply_rotary(q, offset, **kw))
        assert torch.equal(out[1], apply_rotary(k, offset, **kw))
        assert torch.equal(rope.rotate(k, offset=offset), out[1])
        assert all(a.shape == shape and a.dtype == dtype for a in out)
    assert torch.equal(rope(q.half(), k.half())[0], apply_rotary(q.half(), **kw))
    # the cached table is the function's table of positions 0 .. max_len - 1, its sine
    # signed as the rotation takes it: -sin θ on each pair's first channel
    cos, signed = rope._tables[(q.device, dtype)]
    want = rotary_cos_sin(64, 16, layout=layout, rotary_dim=rotary_dim, dtype=dtype)
    first = torch.arange(want[1].shape[-1])
    first = first % 2 == 0 if layout == "interleaved" else first < first.numel() // 2
    sin = torch.where(first, -signed, signed)
    assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])
    assert torch.equal(signed[:, first], -want[1][:, first])


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape", [(1, 4, 1, 16), (2, 3, 6, 16), (6, 16)])
def test_apply_rotary_given_tables_is_bitwise_the_positions_path(layout, dtype, shape):
    # (was: the given-tables fast path against the checked path, now one path) tables
    # of x's dtype, of another dtype (converted), partial tables; bad ones raise
    torch.manual_seed(15)
    x = torch.randn(shape, dtype=dtype)
    pos = torch.arange(9, 9 + shape[-2])
    cos, sin = rotary_cos_sin(pos, 16, dtype=dtype, layout=layout)
    given = apply_rotary(x, cos=cos, sin=sin, layout=layout)
    assert torch.equal(given, apply_rotary(x, pos, layout=layout))
    other = torch.float64 if dtype == torch.float32 else torch.float32
    converted = apply_rotary(x, cos=cos.to(other), sin=sin.to(other), layout=layout)
    assert torch.equal(converted, apply_rotary(x, cos=cos.to(other).to(dtype),
                                               sin=sin.to(other).to(dtype), layout=layout))  # fmt: skip
    c8, s8 = rotary_cos_sin(pos, 8, dtype=dtype, layout=layout)
    partial = apply_rotary(x, cos=c8, sin=s8, layout=layout)
    assert torch.equal(partial, apply_rotary(x, pos, layout=layout, rotary_dim=8))
    assert apply_rotary(x.half(), cos=cos, sin=sin, layout=layout).dtype == torch.half
    with pytest.raises(ValueError, match="rotary_dim=8 does not match"):
        apply_rotary(x, cos=cos, sin=sin, layout=layout, rotary_dim=8)
    with pytest.raises(ValueError, match="layout"):
        apply_rotary(x, cos=cos, sin=sin, layout="halves")


def test_per_sequence_positions_give_the_packed_result():
    torch.manual_seed(13)
    rope = RotaryEmbedding(16, max_len=16)
    q, k = torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)
    # row 0: two packed documents (4 + 3 tokens); row 1: left padding of 2, then positions 0..4
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2], [0, 0, 0, 1, 2, 3, 4]])
    pq, pk = rope(q, k, positions=positions)
    doc1 = rope(q[:1, :, :4], k[:1, :, :4])
    doc2 = rope(q[:1, :, 4:], k[:1, :, 4:])
    assert torch.equal(pq[:1, :, :4], doc1[0]) and torch.equal(pq[:1, :, 4:], doc2[0])
    assert torch.equal(pk[:1, :, 4:], doc2[1])
    row1 = rope(q[1:, :, 2:], k[1:, :, 2:])
    assert torch.equal(pq[1:, :, 2:], row1[0]) and torch.equal(pk[1:, :, 2:], row1[1])
    shared = rope(q, k, positions=torch.arange(7))
    assert torch.equal(shared[0], rope(q, k)[0])


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str
)
def test_module_keeps_dtype_and_caches_one_table_per_compute_dtype(dtype):
    rope = RotaryEmbedding(16, max_len=8)
    q = torch.randn(1, 2, 5, 16).to(dtype)
    rq, rk = rope(q, q[:, :1])
    assert (
        rq.dtype == rk.dtype == dtype
        and rq.shape == q.shape
        and rk.shape == (1, 1, 5, 16)
    )
    compute = torch.float32 if dtype in HALF else dtype
    assert list(rope._tables) == [(torch.device("cpu"), compute)]
    assert torch.equal(rq, apply_rotary(q))


def test_q_and_k_of_different_dtypes():
    """Each is rotated with its own rows, rounded once to its dtype: k in float64 is not rotated by q's float32
    rows converted up (rounded twice, off by up to about 6e-8 times |k|)."""
    rope = RotaryEmbedding(8)
    gen = torch.Generator().manual_seed(0)
    for q_dtype, k_dtype in [
        (torch.float32, torch.float64),
        (torch.float64, torch.float32),
    ]:
        q = torch.randn(1, 2, 3, 8, generator=gen, dtype=q_dtype)
        k = torch.randn(1, 1, 3, 8, generator=gen, dtype=k_dtype)
        rq, rk = rope(q, k, offset=5)
        assert rq.dtype == q_dtype and rk.dtype == k_dtype
        assert torch.equal(rq, rope.rotate(q, offset=5))
        assert torch.equal(rk, rope.rotate(k, offset=5))
        assert torch.equal(rk, apply_rotary(k, torch.arange(5, 8)))


def test_state_dict_pickle_deepcopy_and_repr():
    linear = {"rope_type": "linear", "factor": 2.0}
    rope = RotaryEmbedding(16, max_len=8, layout="half", rotary_dim=8, scaling=linear)
    rope(torch.randn(1, 1, 3, 16), torch.randn(1, 1, 3, 16))
    assert (
        rope.state_dict() == {}
        and list(rope.parameters()) == []
        and list(rope.buffers()) == []
    )
    assert rope._tables
    clone = pickle.loads(pickle.dumps(rope))
    assert clone._tables == {} and rope._tables
    assert copy.deepcopy(rope)._tables == {}
    assert (
        "rotary_dim=8" in repr(rope)
        and "layout='half'" in repr(rope)
        and "rope_type='linear'" in repr(rope)
    )
    x = torch.randn(1, 1, 3, 16)
    assert torch.equal(clone(x, x)[0], rope(x, x)[0])


def test_cos_sin_method_matches_the_function():
    kw = {"rotary_dim": 16, "layout": "half", "base": 500.0}
    linear = {"rope_type": "linear", "factor": 2.0}
    rope = RotaryEmbedding(32, scaling=linear, **kw)
    c1, s1 = rope.cos_sin(torch.arange(9))
    c2, s2 = rotary_cos_sin(9, 32, scaling=linear, **kw)
    assert torch.equal(c1, c2) and torch.equal(s1, s2)


def test_three_dimensional_and_two_dimensional_inputs():
    x3 = torch.randn(2, 5, 8)  # [batch, seq_len, head_dim]
    pos = torch.tensor([[0, 1, 2, 3, 4], [9, 8, 7, 6, 5]])
    y = apply_rotary(x3, pos)
    assert torch.equal(y[1], apply_rotary(x3[1], pos[1]))  # [seq_len, head_dim]


def test_gradients_flow_through_the_rotation():
    x = torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: apply_rotary(t, 3, layout="half", rotary_dim=4), (x,)
    )


# ----------------------------------------------------------------------------------------------------------
# torch.compile and torch.export: bitwise equal to eager
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def inductor_cache():
    """Fresh dynamo state around a compiled test. The inductor cache is already private: one per test run, made
    by tests/plugin.py (a cache shared across runs has produced wrong code on this project's machines)."""
    assert "posenc-run-" in os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""), (
        "tests/plugin.py not loaded"
    )
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@needs_compile
def test_compiled_module_reads_the_cached_table():
    graphs: list = []
    rope = RotaryEmbedding(16, max_len=32)
    compiled = torch.compile(rope, backend=recording_backend(graphs), fullgraph=True)
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 1, 5, 16)
    out = compiled(q, k, offset=3)
    assert all(torch.equal(a, b) for a, b in zip(out, rope(q, k, offset=3)))
    assert not any("rotary_tables" in str(n.target) for n in graphs[0].graph.nodes)
    assert type(rope._tables[(torch.device("cpu"), torch.float32)][0]) is torch.Tensor


@needs_compile
def test_inductor_module_bitwise_for_lengths_offsets_and_past_max_len(inductor_cache):
    rope = RotaryEmbedding(32, max_len=48, layout="half", rotary_dim=24)
    compiled = torch.compile(rope, fullgraph=True, dynamic=True)
    for seq_len, offset in [(5, 0), (9, 3), (20, 40), (3, 100)]:
        q, k = torch.randn(2, 4, seq_len, 32), torch.randn(2, 2, seq_len, 32)
        got, want = compiled(q, k, offset=offset), rope(q, k, offset=offset)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (seq_len, offset)


@needs_compile
def test_inductor_function_bitwise_with_positions_in_bfloat16(inductor_cache):
    compiled = torch.compile(apply_rotary, fullgraph=True, dynamic=True)
    for seq_len in (7, 30):
        x = torch.randn(2, 3, seq_len, 64).bfloat16()
        positions = torch.randint(0, 2**20, (2, seq_len))
        assert torch.equal(compiled(x, positions), apply_rotary(x, positions))


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rope = RotaryEmbedding(32, max_len=16)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rope(q, k)


@needs_export
@pytest.mark.parametrize("strict", [False, True])
def test_export_module_bitwise_and_holds_no_table(strict):
    model = _Attention()
    seq = torch.export.Dim("seq", min=2, max=4096)
    q, k = torch.randn(1, 4, 6, 32), torch.randn(1, 2, 6, 32)
    program = torch.export.export(
        model, (q, k), dynamic_shapes={"q": {2: seq}, "k": {2: seq}}, strict=strict
    )
    assert model.rope._tables == {} and len(program.constants) == 0
    for seq_len in (2, 16, 100):  # 100 > max_len
        q, k = torch.randn(1, 4, seq_len, 32), torch.randn(1, 2, seq_len, 32)
        assert all(
            torch.equal(a, b) for a, b in zip(program.module()(q, k), model(q, k))
        )


@needs_export
def test_export_function_with_positions_bitwise():
    class WithPositions(nn.Module):
        def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return apply_rotary(x, positions, layout="half")

    seq = torch.export.Dim("seq", min=2, max=4096)
    x, pos = torch.randn(2, 4, 8, 32), torch.randint(0, 100, (2, 8))
    program = torch.export.export(
        WithPositions(), (x, pos), dynamic_shapes={"x": {2: seq}, "positions": {1: seq}}
    )
    x, pos = torch.randn(2, 4, 21, 32), torch.randint(0, 2**20, (2, 21))
    assert torch.equal(program.module()(x, pos), apply_rotary(x, pos, layout="half"))


# ----------------------------------------------------------------------------------------------------------
# Scaling (rope_type): the formulas of chapter 06, checked from their definitions (transformers itself:
# test_rotation_peers.py)
# ----------------------------------------------------------------------------------------------------------

LLAMA31 = peers.LLAMA31


def test_rope_types_and_the_default_frequencies():
    assert ROPE_TYPES[:6] == tuple(
        "default linear dynamic yarn llama3 longrope".split()
    )
    for head_dim, base in ((128, 1e4), (64, 5e5), (2, 10.0)):
        omega, attention = rotary_frequencies(head_dim, base=base)
        assert omega.dtype == torch.float64 and omega.shape == (head_dim // 2,)
        assert torch.equal(omega, frequencies(head_dim, base=base)) and attention == 1.0
    # the frequencies against 100-digit ones
    mpmath.mp.dps = 100
    omega, _ = rotary_frequencies(128, base=5e5)
    exact = [mpmath.power(500000, mpmath.mpf(-2 * i) / 128) for i in range(64)]
    assert max(abs(float((w - e) / e)) for w, e in zip(omega.tolist(), exact)) <= U64
    # base from the dict's rope_theta; "type" (transformers 4.x) and "mrope" (Qwen2-VL) read too
    via_theta, _ = rotary_frequencies(64, scaling={"rope_theta": 1e6})
    assert torch.equal(via_theta, frequencies(64, base=1e6))
    legacy, _ = rotary_frequencies(64, scaling={"type": "linear", "factor": 2.0})
    assert torch.equal(legacy, frequencies(64) / 2)
    mrope, _ = rotary_frequencies(
        64, scaling={"type": "mrope", "mrope_section": [8] * 4}
    )
    assert torch.equal(mrope, frequencies(64))


@pytest.mark.parametrize("factor", [0.5, 2.0, 4.0, 3.0])
def test_linear_divides_every_frequency(factor):
    omega, attention = rotary_frequencies(
        96, scaling={"rope_type": "linear", "factor": factor}
    )
    assert torch.equal(omega, frequencies(96) / factor) and attention == 1.0


def test_dynamic_ntk_raises_the_base_with_the_sequence():
    d, length, s = 64, 4096, 2.0
    dynamic = {"rope_type": "dynamic", "factor": s, "max_position_embeddings": length}
    for seq_len in (
        None,
        1,
        length,
    ):  # up to the original length: the trained frequencies
        assert torch.equal(rotary_frequencies(d, scaling=dynamic, seq_len=seq_len)[0],
                           frequencies(d))  # fmt: skip
    for n in (length + 1, 2 * length, 10**6):
        base = 1e4 * ((s * n / length) - (s - 1)) ** (d / (d - 2))
        omega, _ = rotary_frequencies(d, scaling=dynamic, seq_len=n)
        assert torch.equal(omega, frequencies(d, base=base))
        assert omega[0] == 1.0 and omega[-1] < frequencies(d)[-1]


@pytest.mark.parametrize("s", [4.0, 40.0])
def test_yarn_keeps_fast_pairs_divides_slow_ones_and_scales_attention(s):
    d, base, original = 128, 1e4, 4096
    yarn = {
        "rope_type": "yarn",
        "factor": s,
        "original_max_position_embeddings": original,
    }
    omega, attention = rotary_frequencies(d, base=base, scaling=yarn)
    g = (omega / frequencies(d)).numpy()

    def pair(
        turns: float,
    ) -> float:  # the pair that turns `turns` times over the context
        return d * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = math.floor(pair(32)), math.ceil(pair(1))
    assert np.allclose(g[:low], 1, rtol=1e-15, atol=0)
    assert np.allclose(g[high:], 1 / s, rtol=1e-15, atol=0)
    assert (np.diff(g) <= 1e-15).all()  # non-increasing: a ramp between
    assert attention == 0.1 * math.log(s) + 1
    deepseek = {**yarn, "mscale": 1.0, "mscale_all_dim": 0.707}
    _, ratio = rotary_frequencies(d, scaling=deepseek)
    assert ratio == (0.1 * math.log(s) + 1) / (0.1 * 0.707 * math.log(s) + 1)
    _, given = rotary_frequencies(d, scaling={**yarn, "attention_factor": 0.9})
    assert given == 0.9


def test_llama3_bands():
    d = 128
    omega, attention = rotary_frequencies(d, scaling=LLAMA31)
    plain = frequencies(d, base=5e5)
    wavelength = 2 * math.pi / plain
    high, low = wavelength < 8192 / 4, wavelength > 8192 / 1
    assert torch.equal(omega[high], plain[high]) and torch.equal(
        omega[low], plain[low] / 8
    )
    mid = ~(high | low)
    smooth = (8192 / wavelength[mid] - 1) / (4 - 1)
    torch.testing.assert_close(
        omega[mid],
        (1 - smooth) * plain[mid] / 8 + smooth * plain[mid],
        rtol=4 * U64,
        atol=0,
    )
    assert mid.any() and attention == 1.0


def test_longrope_switches_factors_past_the_original_length():
    d, original = 96, 4096
    short, long = (
        [1.0 + 0.01 * i for i in range(48)],
        [1.0 + 0.5 * i for i in range(48)],
    )
    phi = {"rope_type": "longrope", "short_factor": short, "long_factor": long,
           "original_max_position_embeddings": original, "max_position_embeddings": 131072}  # fmt: skip
    for seq_len, factors in ((None, short), (original, short), (original + 1, long)):
        omega, attention = rotary_frequencies(d, scaling=phi, seq_len=seq_len)
        torch.testing.assert_close(
            omega, frequencies(d) / torch.tensor(factors, dtype=torch.float64),
            rtol=U64, atol=0,
        )  # fmt: skip
        assert attention == math.sqrt(1 + math.log(32) / math.log(original))


def test_partial_rotary_factor_sets_the_rotated_width():
    omega, _ = rotary_frequencies(80, scaling={"partial_rotary_factor": 0.4})
    assert torch.equal(omega, frequencies(32))  # int(80 * 0.4) = 32 channels
    rope = RotaryEmbedding(80, scaling={"partial_rotary_factor": 0.4})
    assert rope.rotary_dim == 32
    x = torch.randn(1, 2, 5, 80)
    assert torch.equal(rope.rotate(x, offset=9), apply_rotary(x, 9, rotary_dim=32))
    assert torch.equal(
        RotaryEmbedding(
            80, rotary_dim=32, scaling={"partial_rotary_factor": 0.4}
        ).rotate(x),
        rope.rotate(x),
    )


def test_attention_factor_is_in_the_tables():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    p = torch.arange(0, 3000, 7)
    cos, sin = rotary_cos_sin(p, 64, scaling=yarn, dtype=torch.float64)
    omega, attention = rotary_frequencies(64, scaling=yarn)
    theta = p.double()[:, None] * omega
    torch.testing.assert_close(
        cos[:, ::2], attention * theta.cos(), rtol=0, atol=4 * U64 * 3000
    )
    torch.testing.assert_close(
        sin[:, 1::2], attention * theta.sin(), rtol=0, atol=4 * U64 * 3000
    )
    cos32, _ = rotary_cos_sin(p, 64, scaling=yarn)
    assert (cos32.double() - cos).abs().max() <= 2.0**-24  # one rounding, values < 2
    # the rotation then scales q and k by the factor (scores by its square)
    x = torch.randn(1, 1, len(p), 64, dtype=torch.float64)
    y = apply_rotary(x, p, scaling=yarn)
    torch.testing.assert_close(
        y.norm(dim=-1), attention * x.norm(dim=-1), rtol=1e-12, atol=0
    )


def test_dynamic_ntk_state_follows_transformers_rules():
    # transformers' dynamic_frequency_update: grow past the longest sequence kept; fall back
    # to the original frequencies when a sequence shorter than max_position_embeddings comes
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 512}
    rope = RotaryEmbedding(64, scaling=dynamic, max_len=1024)
    x = torch.randn(1, 2, 1, 64)
    for length, kept in ((100, None), (700, 700), (600, 700), (900, 900), (300, None),
                         (513, 513), (512, 513), (200, None)):  # fmt: skip
        rope.cos_sin(torch.arange(length))
        assert rope._seq_len == kept, length
        want, _ = rotary_frequencies(64, scaling=dynamic, seq_len=kept)
        assert torch.equal(rope.frequencies, want)
    # forward follows the same state: its rows are those of the current frequencies
    rope = RotaryEmbedding(64, scaling=dynamic, max_len=1024)
    got = rope.rotate(x, offset=799)  # a sequence of 800 tokens
    assert rope._seq_len == 800
    assert torch.equal(got, apply_rotary(x, 799, scaling=dynamic))
    got = rope.rotate(
        x, offset=3
    )  # 4 tokens after 800: back to the original frequencies
    assert rope._seq_len is None and torch.equal(
        got, apply_rotary(x, 3, scaling=dynamic)
    )


def test_longrope_module_switches_per_call():
    phi = {"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [4.0] * 16,
           "original_max_position_embeddings": 64, "factor": 8.0}  # fmt: skip
    rope = RotaryEmbedding(32, scaling=phi, max_len=128)
    x = torch.randn(1, 2, 10, 32)
    for offset in (0, 54, 55, 300, 0):  # positions up to 63: short; from 64 on: long
        assert torch.equal(
            rope.rotate(x, offset=offset), apply_rotary(x, offset, scaling=phi)
        )
    short = rotary_frequencies(32, scaling=phi)[0]
    assert torch.equal(rope.frequencies, short)  # the last call was short


# ----------------------------------------------------------------------------------------------------------
# Several position axes
# ----------------------------------------------------------------------------------------------------------


def numpy_axes_rotation(
    x: torch.Tensor, positions: torch.Tensor, omega: np.ndarray, sections: list[int],
    layout: str,
) -> np.ndarray:  # fmt: skip
    """float64 rotation where pair i of section a turns by positions[a] * omega_i (positions [axes, seq])."""
    xs, p = x.double().numpy(), positions.numpy().astype(np.float64)
    axis = np.repeat(np.arange(len(sections)), sections)  # [r / 2]
    theta = p[axis].T * omega  # [seq, r / 2]
    c, s = np.cos(theta), np.sin(theta)
    r = 2 * len(omega)
    if layout == "interleaved":
        ia, ib = np.arange(0, r, 2), np.arange(1, r, 2)
    else:
        ia, ib = np.arange(r // 2), np.arange(r // 2, r)
    out = xs.copy()
    a, b = xs[..., ia], xs[..., ib]
    out[..., ia], out[..., ib] = a * c - b * s, b * c + a * s
    return out


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_multi_axis_rotation_matches_numpy(layout):
    g = torch.Generator().manual_seed(30)
    positions = torch.randint(0, 2**16, (3, 40), generator=g)
    x = torch.randn(2, 4, 40, 64, dtype=torch.float64, generator=g)
    # M-RoPE: one set of frequencies split over the axes
    mrope = {"mrope_section": [8, 12, 12]}
    y = apply_rotary(x, positions, layout=layout, scaling=mrope, base=1e6)
    ref = numpy_axes_rotation(
        x, positions, frequencies(64, base=1e6).numpy(), [8, 12, 12], layout
    )
    assert np.abs(y.numpy() - ref).max() <= 2 * U64 * (2**16 + 8) * 6
    # axes_dim: each axis its own frequencies over its own channels
    y = apply_rotary(x, positions, layout=layout, axes_dim=[16, 24, 24])
    omega = np.concatenate([frequencies(w).numpy() for w in (16, 24, 24)])
    ref = numpy_axes_rotation(x, positions, omega, [8, 12, 12], layout)
    assert np.abs(y.numpy() - ref).max() <= 2 * U64 * (2**16 + 8) * 6
    # per sequence: [axes, batch, seq_len]
    per = torch.stack([positions, positions.flip(-1)], 1)  # [3, 2, 40]
    y = apply_rotary(x, per, layout=layout, axes_dim=[16, 24, 24])
    assert torch.equal(
        y[1], apply_rotary(x[1], per[:, 1], layout=layout, axes_dim=[16, 24, 24])
    )


def test_multi_axis_scores_depend_on_the_displacement_and_text_is_1d():
    g = torch.Generator().manual_seed(31)
    q, k = (torch.randn(1, 64, dtype=torch.float64, generator=g) for _ in range(2))
    grid = RotaryEmbedding(64, axes_dim=[32, 32])

    def score(m, n) -> float:
        rq = grid.rotate(q, positions=torch.tensor(m)[:, None])
        rk = grid.rotate(k, positions=torch.tensor(n)[:, None])
        return (rq * rk).sum().item()

    for shift in ((0, 0), (5, 3), (2**12, 7), (9, 2**14)):
        m, n = (1 + shift[0], 2 + shift[1]), (4 + shift[0], 9 + shift[1])
        assert abs(score(m, n) - score((1, 2), (4, 9))) <= U64 * 4 * (2**15) * 16
    # M-RoPE on tokens with one position on every axis is 1-D RoPE, bitwise
    mrope = RotaryEmbedding(
        64, layout="half", base=1e6, scaling={"mrope_section": [8, 12, 12]}
    )
    x = torch.randn(2, 3, 9, 64)
    p = torch.arange(100, 109)
    assert torch.equal(
        mrope.rotate(x, positions=p.expand(3, -1)),
        RotaryEmbedding(64, layout="half", base=1e6).rotate(x, positions=p),
    )
    cos, _ = mrope.cos_sin(torch.stack([p, p, p])[:, None])  # [3, 1, 9] -> [1, 9, 64]
    assert cos.shape == (1, 9, 64)


# ----------------------------------------------------------------------------------------------------------
# seq_dim, one tensor, and tables that must fit
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_seq_dim_minus_3_is_the_transposed_rotation(layout):
    torch.manual_seed(32)
    rope = RotaryEmbedding(32, layout=layout, max_len=16, rotary_dim=24)
    q, k = (
        torch.randn(2, 8, 12, 32),
        torch.randn(2, 2, 12, 32),
    )  # [batch, heads, seq, dim]
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)  # [batch, seq, heads, dim]
    per = torch.randint(0, 100, (2, 12))
    for kwargs in ({"offset": 0}, {"offset": 9}, {"positions": per}):
        got = rope(qt, kt, seq_dim=-3, **kwargs)
        want = rope(q, k, **kwargs)
        assert all(torch.equal(a.transpose(1, 2), b) for a, b in zip(got, want))
        one = rope.rotate(kt, seq_dim=-3, **kwargs)
        assert torch.equal(one.transpose(1, 2), want[1])
    kw = {"layout": layout, "rotary_dim": 24}
    assert torch.equal(apply_rotary(qt, per, seq_dim=-3, **kw).transpose(1, 2),
                       apply_rotary(q, per, **kw))  # fmt: skip
    cos, sin = rotary_cos_sin(per, 32, **kw)  # [batch, seq, r]
    assert torch.equal(apply_rotary(qt, cos=cos, sin=sin, seq_dim=-3, layout=layout),
                       apply_rotary(q, per, **kw).transpose(1, 2))  # fmt: skip


def test_rotate_one_tensor_at_its_own_offset():
    torch.manual_seed(33)
    rope = RotaryEmbedding(16, max_len=32)
    q, k = torch.randn(1, 4, 20, 16), torch.randn(1, 2, 20, 16)
    full_q, full_k = rope(q, k)
    cache = torch.cat(
        [rope.rotate(k[:, :, t : t + 1], offset=t) for t in range(20)], -2
    )
    assert torch.equal(cache, full_k)
    # a query of another length than the keys: each at its own positions
    assert torch.equal(rope.rotate(q[:, :, -1:], offset=19), full_q[:, :, -1:])
    assert torch.equal(rope.rotate(k, positions=torch.arange(20)), full_k)


def test_tables_of_another_shape_raise_instead_of_broadcasting():
    x = torch.randn(1, 4, 4, 8)  # [batch, heads = 4, seq_len = 4, head_dim]
    cos, sin = rotary_cos_sin(4, 8, layout="half")  # [4, 8]
    apply_rotary(x, cos=cos, sin=sin, layout="half")  # the right shape
    for c, s in ((cos[:, None], sin[:, None]),  # [seq, 1, r]: would broadcast over heads
                 (cos[None, None], sin[None, None]),  # [1, 1, seq, r]
                 (cos.expand(2, 4, 8), sin.expand(2, 4, 8)),  # batch 2 for batch 1
                 (cos[:3], sin[:3])):  # fmt: skip
        with pytest.raises(
            ValueError, match=r"cos and sin must be \[seq_len, rotary_dim\]"
        ):
            apply_rotary(x, cos=c, sin=s, layout="half")
    with pytest.raises(ValueError, match="positions must have shape"):
        apply_rotary(x, torch.arange(4)[None].expand(4, 4))  # [4, 4] positions, batch 1
    with pytest.raises(ValueError, match="describe"):
        apply_rotary(x, cos=cos, sin=sin, layout="half", scaling={"rope_type": "linear",
                                                                  "factor": 2.0})  # fmt: skip


# ----------------------------------------------------------------------------------------------------------
# torch.compile and torch.export of the new settings; negative offsets while tracing
# ----------------------------------------------------------------------------------------------------------


@needs_compile
@pytest.mark.parametrize("dynamic", [False, True, None])
def test_compiled_negative_offset_raises(inductor_cache, dynamic):
    rope = RotaryEmbedding(16, max_len=16)
    compiled = torch.compile(rope, fullgraph=True, dynamic=dynamic)
    q = torch.randn(1, 2, 1, 16)
    for offset in (
        3,
        4,
    ):  # a second value makes dynamic=None trace the offset as a symbol
        assert all(torch.equal(a, b) for a, b in zip(compiled(q, q, offset=offset),
                                                     rope(q, q, offset=offset)))  # fmt: skip
    for offset in (-1, -3):  # -3 used to rotate as position 13, -1 to return nothing
        with pytest.raises(Exception) as raised:
            compiled(q, q, offset=offset)
        text = str(raised.value) + repr(raised.value.__cause__)
        assert "offset must be an int >= 0" in text


@needs_compile
@pytest.mark.parametrize("dynamic", [True, None])
def test_compiled_decoding_is_traced_once_not_once_per_offset(inductor_cache, dynamic):
    # one token per step at offsets 2..13, as a decoding loop calls it. The offset is traced as a symbol (one
    # graph; dynamic=None first traces a static one); operator.index once specialised every graph to its
    # offset: 8 graphs, then dynamo's recompile limit, a warning and eager mode
    from torch._dynamo.utils import counters

    rope = RotaryEmbedding(32, max_len=64)
    compiled = torch.compile(rope, backend="eager", fullgraph=True, dynamic=dynamic)
    counters.clear()
    for offset in range(2, 14):
        q, k = torch.randn(1, 2, 1, 32), torch.randn(1, 2, 1, 32)
        got, want = compiled(q, k, offset=offset), rope(q, k, offset=offset)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), offset
    assert counters["stats"]["unique_graphs"] <= (1 if dynamic else 2), dict(
        counters["stats"]
    )


@needs_compile
def test_compiled_scaled_and_multi_axis_modules_are_bitwise_eager(inductor_cache):
    q = torch.randn(1, 4, 10, 128)
    llama = RotaryEmbedding(128, layout="half", scaling=LLAMA31, max_len=64)
    compiled = torch.compile(llama, fullgraph=True)
    pos = torch.randint(0, 10**5, (1, 10))
    for kwargs in ({"offset": 5}, {"offset": 60}, {"positions": pos}):
        assert all(
            torch.equal(a, b)
            for a, b in zip(compiled(q, q, **kwargs), llama(q, q, **kwargs))
        )
    mrope = RotaryEmbedding(128, layout="half", base=1e6,
                            scaling={"type": "mrope", "mrope_section": [16, 24, 24]})  # fmt: skip
    p3 = torch.randint(0, 100, (3, 1, 10))
    compiled = torch.compile(mrope, fullgraph=True)
    assert all(
        torch.equal(a, b)
        for a, b in zip(compiled(q, q, positions=p3), mrope(q, q, positions=p3))
    )
    flux = torch.compile(lambda x, ids: apply_rotary(x, ids, axes_dim=[16, 56, 56], seq_dim=-3),
                         fullgraph=True)  # fmt: skip
    x, ids = torch.randn(1, 10, 2, 128), torch.randint(0, 64, (3, 10))
    assert torch.equal(
        flux(x, ids), apply_rotary(x, ids, axes_dim=[16, 56, 56], seq_dim=-3)
    )
    scaled = torch.compile(lambda x, p: apply_rotary(x, p, layout="half", scaling=LLAMA31),
                           fullgraph=True)  # fmt: skip
    assert torch.equal(
        scaled(q, pos), apply_rotary(q, pos, layout="half", scaling=LLAMA31)
    )


@needs_compile
def test_frequencies_that_follow_the_sequence_raise_under_compile(inductor_cache):
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}
    compiled = torch.compile(RotaryEmbedding(32, scaling=dynamic), fullgraph=True)
    q = torch.randn(1, 2, 4, 32)
    with pytest.raises(Exception) as raised:
        compiled(q, q, positions=torch.arange(4))
    assert "changes its frequencies with the sequence length" in (
        str(raised.value) + repr(raised.value.__cause__)
    )


@needs_export
def test_export_with_scaling_bitwise_and_holds_no_table():
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rope = RotaryEmbedding(128, layout="half", scaling=LLAMA31, max_len=16)

        def forward(
            self, q: torch.Tensor, k: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            return self.rope(q, k)

    model, seq = Model(), torch.export.Dim("seq", min=2, max=4096)
    q = torch.randn(1, 2, 6, 128)
    program = torch.export.export(
        model, (q, q), dynamic_shapes={"q": {2: seq}, "k": {2: seq}}
    )
    assert len(program.constants) == 0
    for n in (2, 40):
        q = torch.randn(1, 2, n, 128)
        assert all(
            torch.equal(a, b) for a, b in zip(program.module()(q, q), model(q, q))
        )


# ----------------------------------------------------------------------------------------------------------
# Bad inputs: the error names the argument and what was given
# ----------------------------------------------------------------------------------------------------------

_q = torch.zeros(1, 2, 3, 8)
BAD = [
    ("odd head_dim", lambda: RotaryEmbedding(7), ValueError, r"head_dim.*even.*got 7"),
    ("head_dim float", lambda: RotaryEmbedding(8.0), TypeError, r"head_dim"),
    (
        "odd rotary_dim",
        lambda: RotaryEmbedding(8, rotary_dim=3),
        ValueError,
        r"rotary_dim.*got 3",
    ),
    (
        "rotary_dim > head_dim",
        lambda: RotaryEmbedding(8, rotary_dim=16),
        ValueError,
        r"rotary_dim.*<= head_dim=8.*got 16",
    ),
    (
        "bad layout",
        lambda: RotaryEmbedding(8, layout="neox"),
        ValueError,
        r"layout.*'neox'",
    ),
    ("base <= 1", lambda: RotaryEmbedding(8, base=1.0), ValueError, r"base"),
    (
        "factor 0",  # (was: scale=0)
        lambda: RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 0}),
        ValueError,
        r"scaling\['factor'\] must be a finite number > 0, got 0",
    ),
    ("max_len 0", lambda: RotaryEmbedding(8, max_len=0), ValueError, r"max_len.*got 0"),
    (
        "wrong last dim",
        lambda: RotaryEmbedding(16)(_q, _q),
        ValueError,
        r"q's last dimension must be head_dim=16.*\(1, 2, 3, 8\)",
    ),
    (
        "integer q",
        lambda: RotaryEmbedding(8)(_q.long(), _q),
        TypeError,
        r"q must be a floating tensor.*int64",
    ),
    (
        "q/k seq mismatch",
        lambda: RotaryEmbedding(8)(_q, _q[:, :, :2]),
        ValueError,
        r"q and k.*\(1, 2, 3, 8\).*\(1, 2, 2, 8\)",
    ),
    (
        "k heads not dividing",
        lambda: RotaryEmbedding(8)(torch.zeros(1, 3, 3, 8), torch.zeros(1, 2, 3, 8)),
        ValueError,
        r"q and k",
    ),
    (
        "negative offset",
        lambda: RotaryEmbedding(8)(_q, _q, offset=-1),
        ValueError,
        r"offset.*got -1",
    ),
    (
        "float offset",
        lambda: RotaryEmbedding(8)(_q, _q, offset=1.5),
        TypeError,
        r"offset.*1\.5",
    ),
    (
        "offset and positions",
        lambda: RotaryEmbedding(8)(_q, _q, offset=2, positions=torch.arange(3)),
        ValueError,
        r"either offset or positions",
    ),
    (
        "float positions",
        lambda: RotaryEmbedding(8)(_q, _q, positions=torch.arange(3.0)),
        TypeError,
        r"positions must be an integer tensor.*float32",
    ),
    (
        "negative positions",
        lambda: apply_rotary(_q, torch.tensor([0, -4, 1])),
        ValueError,
        r"positions must be >= 0.*-4",
    ),
    (
        "positions shape",
        lambda: apply_rotary(_q, torch.arange(4)),
        ValueError,
        r"positions must have shape \[seq_len\]=\(3,\).*\(4,\)",
    ),
    (
        "odd x width",
        lambda: apply_rotary(torch.zeros(2, 3, 7)),
        ValueError,
        r"x's last dimension \(head_dim\) must be even.*\(2, 3, 7\)",
    ),
    (
        "1-D x",
        lambda: apply_rotary(torch.zeros(8)),
        ValueError,
        r"x must be \[\.\.\., seq_len, head_dim\].*\(8,\)",
    ),
    (
        "not a tensor",
        lambda: apply_rotary([1.0, 2.0]),
        TypeError,
        r"x must be a torch.Tensor.*list",
    ),
    (
        "positions float",
        lambda: apply_rotary(_q, 2.5),
        TypeError,
        r"positions must be an int.*2\.5",
    ),
    (
        "tables and positions",
        lambda: apply_rotary(_q, 3, cos=torch.ones(3, 8), sin=torch.zeros(3, 8)),
        ValueError,
        r"either positions or cos",
    ),
    (
        "only cos",
        lambda: apply_rotary(_q, cos=torch.ones(3, 8)),
        TypeError,
        r"cos and sin must both be tensors",
    ),
    (
        "table length",
        lambda: apply_rotary(_q, cos=torch.ones(4, 8), sin=torch.zeros(4, 8)),
        ValueError,
        r"seq_len=3.*\(4, 8\)",
    ),
    (
        "table dtype",
        lambda: rotary_cos_sin(4, 8, dtype=torch.int32),
        TypeError,
        r"dtype must be a floating",
    ),
    ("negative count", lambda: rotary_cos_sin(-1, 8), ValueError, r"positions.*got -1"),
    (
        "scaling not a dict",
        lambda: RotaryEmbedding(8, scaling="llama3"),
        TypeError,
        r"scaling must be a dict like a model config's rope_parameters",
    ),
    (
        "unknown rope_type",
        lambda: RotaryEmbedding(8, scaling={"rope_type": "ntk-by-parts"}),
        ValueError,
        r"scaling\['rope_type'\] must be one of 'default', .*'longrope'.*got 'ntk-by-parts'",
    ),
    (
        "misspelt key",
        lambda: RotaryEmbedding(8, scaling={"rope_type": "linear", "factr": 2.0}),
        ValueError,
        r"key\(s\) \['factr'\] that rope_type 'linear' does not read",
    ),
    (
        "base and rope_theta",
        lambda: RotaryEmbedding(8, base=1e4, scaling={"rope_theta": 5e5}),
        ValueError,
        r"base=10000.0 and scaling\['rope_theta'\]=500000.0 disagree",
    ),
    (
        "rope_type and type",
        lambda: RotaryEmbedding(8, scaling={"rope_type": "yarn", "type": "linear"}),
        ValueError,
        r"rope_type='yarn' and type='linear'",
    ),
    (
        "linear without factor",
        lambda: RotaryEmbedding(8, scaling={"rope_type": "linear"}),
        ValueError,
        r"rope_type 'linear' needs scaling\['factor'\]",
    ),
    (
        "yarn factor below 1",
        lambda: RotaryEmbedding(
            8,
            scaling={
                "rope_type": "yarn",
                "factor": 0.5,
                "original_max_position_embeddings": 64,
            },
        ),
        ValueError,
        r"scaling\['factor'\] must be a finite number >= 1, got 0.5",
    ),
    (
        "dynamic without max_position_embeddings",
        lambda: RotaryEmbedding(8, scaling={"rope_type": "dynamic", "factor": 2.0}),
        ValueError,
        r"needs the model config's max_position_embeddings",
    ),
    (
        "llama3 without high_freq_factor",
        lambda: RotaryEmbedding(
            8, scaling={k: v for k, v in LLAMA31.items() if k != "high_freq_factor"}
        ),
        ValueError,
        r"rope_type 'llama3' needs scaling\['high_freq_factor'\]",
    ),
    (
        "llama3 bands reversed",
        lambda: RotaryEmbedding(8, scaling={**LLAMA31, "high_freq_factor": 0.5}),
        ValueError,
        r"high_freq_factor'\] must be > scaling\['low_freq_factor'\]",
    ),
    (
        "yarn without original length",
        lambda: RotaryEmbedding(8, scaling={"rope_type": "yarn", "factor": 4.0}),
        ValueError,
        r"needs scaling\['original_max_position_embeddings'\]",
    ),
    (
        "longrope factors of the wrong length",
        lambda: rotary_frequencies(
            8,
            scaling={
                "rope_type": "longrope",
                "short_factor": [1.0] * 3,
                "long_factor": [1.0] * 4,
                "factor": 2.0,
                "original_max_position_embeddings": 64,
            },
        ),
        ValueError,
        r"scaling\['short_factor'\] must hold one factor per pair .*\(4 for 8 channels\), got 3",
    ),
    (
        "mrope_section not summing to the pairs",
        lambda: RotaryEmbedding(16, scaling={"mrope_section": [2, 2, 2]}),
        ValueError,
        r"mrope_section'\] must split the 8 pairs .*got \[2, 2, 2\] \(sum 6\)",
    ),
    (
        "axes_dim not summing to the channels",
        lambda: RotaryEmbedding(16, axes_dim=[4, 4]),
        ValueError,
        r"axes_dim must be a list of positive even ints .*summing to the 16 .*\[4, 4\]",
    ),
    (
        "axes_dim and mrope_section",
        lambda: RotaryEmbedding(16, axes_dim=[8, 8], scaling={"mrope_section": [4, 4]}),
        ValueError,
        r"either axes_dim .* or scaling\['mrope_section'\]",
    ),
    (
        "axes_dim with yarn",
        lambda: RotaryEmbedding(
            16,
            axes_dim=[8, 8],
            scaling={
                "rope_type": "yarn",
                "factor": 2.0,
                "original_max_position_embeddings": 64,
            },
        ),
        ValueError,
        r"axes_dim supports rope_type 'default' and 'linear', got 'yarn'",
    ),
    (
        "multi-axis with an offset",
        lambda: RotaryEmbedding(16, axes_dim=[8, 8])(
            torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 3, 16)
        ),
        ValueError,
        r"multi-axis RoPE needs positions=\[2, seq_len\]",
    ),
    (
        "multi-axis positions of one axis",
        lambda: apply_rotary(
            torch.zeros(1, 2, 3, 16), torch.arange(3), axes_dim=[8, 8]
        ),
        ValueError,
        r"positions must have shape \[axes, seq_len\]=\(2, 3,\)",
    ),
    (
        "seq_dim -1",
        lambda: apply_rotary(_q, seq_dim=-1),
        ValueError,
        r"seq_dim must be -2 .* or -3 .*got -1",
    ),
    (
        "partial_rotary_factor and rotary_dim",
        lambda: RotaryEmbedding(
            8, rotary_dim=8, scaling={"partial_rotary_factor": 0.5}
        ),
        ValueError,
        r"rotary_dim=8 disagrees with scaling\['partial_rotary_factor'\]=0.5",
    ),
    (
        "tables with scaling",
        lambda: apply_rotary(
            _q, cos=torch.ones(3, 8), sin=torch.zeros(3, 8), base=500.0
        ),
        ValueError,
        r"base describe\(s\) how tables are computed",
    ),
    (
        "rotate: wrong head_dim",
        lambda: RotaryEmbedding(16).rotate(_q),
        ValueError,
        r"x's last dimension must be head_dim=16",
    ),
]


@pytest.mark.parametrize(
    ("name", "call", "error", "match"), BAD, ids=[b[0] for b in BAD]
)
def test_bad_inputs_raise_helpful_errors(name, call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_fractional_positions_are_refused_pointing_to_linear_scaling() -> None:
    # positions.long() would turn 0.5 into 0 without a word: the message must not advise it; the scaling it
    # names instead runs, and rotates integer positions p as the fractional positions p / factor
    with pytest.raises(TypeError) as info:
        RotaryEmbedding(8)(_q, _q, positions=torch.tensor([0.0, 0.5, 1.5]))
    message = str(info.value)
    assert ".long()" not in message, message
    for words in ("positions", "torch.float32", "integer positions are required"):
        assert words in message, message
    scaling = re.search(r"scaling=(\{.*\})", message)
    assert scaling, message
    config = ast.literal_eval(
        scaling.group(1).replace("f}", "2.0}")
    )  # the dict as the message writes it
    cos, sin = rotary_cos_sin(
        torch.tensor([0, 1, 3]), 8, scaling=config, dtype=torch.float64
    )
    angles = torch.tensor([0.0, 0.5, 1.5], dtype=torch.float64)[:, None] * (
        10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    )
    expected = angles.repeat_interleave(2, -1)  # the default layout, interleaved
    assert torch.allclose(cos, expected.cos(), atol=1e-15) and torch.allclose(
        sin, expected.sin(), atol=1e-15
    )


# ----------------------------------------------------------------------------------------------------------
# CUDA (skipped without it; tools/gpu_check.py runs them)
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str
)
def test_cuda_rotation_within_the_cpu_bounds(dtype):
    g = torch.Generator().manual_seed(20)
    p = torch.cat(
        [torch.arange(0, 1024), torch.randint(1024, 2**20, (1024,), generator=g)]
    )
    x = torch.randn(2, 4, len(p), 128, generator=g)
    for layout in ("interleaved", "half"):
        y = apply_rotary(x.to(dtype).cuda(), p.cuda(), layout=layout)
        assert y.device.type == "cuda" and y.dtype == dtype
        ref = torch.from_numpy(peers.numpy_rotation(x.to(dtype), p, layout=layout))
        err = (y.cpu().double() - ref).abs()
        e32 = float32_bound(x.to(dtype), 2**20, layout=layout)
        if dtype == torch.float64:
            assert (err <= float64_bound(p, x, layout)).all()
        elif dtype == torch.float32:
            assert (err <= e32).all()
        else:
            mag = (ref.abs() + e32).clamp_min(torch.finfo(dtype).smallest_normal)
            assert (
                err
                <= 2.0 ** torch.floor(torch.log2(mag)) * torch.finfo(dtype).eps / 2
                + e32
            ).all()


@pytest.mark.gpu
def test_cuda_module_decoding_bitwise_and_compiled_within_bound(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.manual_seed(21)
    rope = RotaryEmbedding(64, max_len=16)
    q, k = (
        torch.randn(1, 8, 24, 64, device="cuda"),
        torch.randn(1, 2, 24, 64, device="cuda"),
    )
    fq, fk = rope(q, k)
    for t in range(24):
        sq, sk = rope(q[:, :, t : t + 1], k[:, :, t : t + 1], offset=t)
        assert torch.equal(sq, fq[:, :, t : t + 1]) and torch.equal(
            sk, fk[:, :, t : t + 1]
        )
    torch._dynamo.reset()
    compiled = torch.compile(rope, fullgraph=True)
    # triton may fuse a product and a sum into one FMA: the compiled result is within the float32 bound, not bitwise
    for got, want, x in zip(compiled(q, k, offset=3), rope(q, k, offset=3), (q, k)):
        assert ((got - want).abs().cpu() <= 2 * float32_bound(x.cpu(), 64)).all()
    torch._dynamo.reset()


@pytest.mark.gpu
def test_cuda_scaled_and_multi_axis_rotations_match_the_cpu_and_keep_their_state():
    # llama3 tables, M-RoPE positions and dynamic NTK's state on the device: the CPU's values to the float32
    # bound (the float64 tables of both are the same values, rounded once), the same state after each call
    torch.manual_seed(22)
    q = torch.randn(2, 4, 40, 128)
    pos3 = torch.randint(0, 4096, (3, 2, 40))
    cases = [
        (
            {"layout": "half", "scaling": LLAMA31},
            {"positions": torch.randint(0, 10**5, (2, 40))},
        ),
        (
            {"layout": "half", "base": 1e6, "scaling": {"mrope_section": [16, 24, 24]}},
            {"positions": pos3},
        ),
        ({"axes_dim": [32, 48, 48]}, {"positions": pos3}),
    ]
    for options, kwargs in cases:
        rope = RotaryEmbedding(128, **options)
        cpu = rope.rotate(q, **kwargs)
        cuda = rope.to("cuda").rotate(
            q.cuda(), **{k: v.cuda() for k, v in kwargs.items()}
        )
        assert cuda.device.type == "cuda"
        assert ((cuda.cpu() - cpu).abs() <= 2 * float32_bound(q, 10**5)).all()
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 512}
    on_cpu, on_cuda = (
        RotaryEmbedding(64, scaling=dynamic),
        RotaryEmbedding(64, scaling=dynamic),
    )
    for length in (100, 700, 300):
        on_cpu.cos_sin(torch.arange(length))
        on_cuda.cos_sin(torch.arange(length, device="cuda"))
        assert on_cpu._seq_len == on_cuda._seq_len


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rounding_once_is_within_half_an_ulp_and_each_rounds_every_operation(dtype):
    torch.manual_seed(0)
    q, k = (torch.randn(2, 4, 33, 64).to(dtype) for _ in "qk")
    cos, sin = rotary_cos_sin(torch.arange(100, 133), 64, layout="half", dtype=dtype)
    # "each": the arithmetic of x * cos + rotate_half(x) * sin in x's dtype, on the
    # tables rounded once to it
    each = [x * cos + _rotate_half(x) * sin for x in (q, k)]
    rope = RotaryEmbedding(64, layout="half", rounding="each")
    for got, want in zip(rope(q, k, offset=100), each):
        assert torch.equal(got, want) and got.dtype == dtype
    assert torch.equal(apply_rotary(q, 100, layout="half", rounding="each"), each[0])
    kw = {"cos": cos.float(), "sin": sin.float(), "layout": "half", "rounding": "each"}
    assert torch.equal(apply_rotary(q, **kw), each[0])  # tables cast to x's dtype
    assert torch.equal(rope.rotate(q, offset=100), each[0])
    # "once" (the default): the float64 rotation of x rounded once, to within half a
    # unit in the last place, plus the float32 computation's few units of 2^-24 of
    # the terms |a| + |b| (bounded here by 2^-22 of them)
    exact = apply_rotary(q.double(), 100, layout="half")
    once = RotaryEmbedding(64, layout="half")(q, k, offset=100)[0]
    tiny = torch.finfo(dtype).smallest_normal
    spacing = torch.finfo(dtype).eps * 2.0 ** torch.floor(
        torch.log2(exact.abs() + tiny)
    )
    terms = (q.abs() + q.roll(32, -1).abs()).double()
    error = (once.double() - exact).abs()
    assert (error <= spacing / 2 + terms * 2.0**-22).all()
    assert (each[0].double() - exact).abs().max() > error.max()


def test_rounding_must_be_once_or_each():
    with pytest.raises(ValueError, match="rounding"):
        RotaryEmbedding(8, rounding="fast")
    with pytest.raises(ValueError, match="rounding"):
        apply_rotary(torch.zeros(1, 2, 8), rounding="per_op")
    assert "rounding='each'" in repr(RotaryEmbedding(8, rounding="each"))
