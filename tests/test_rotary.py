"""Rotary position embeddings (book/10_rotary.ipynb): tables, rotation, module, peers, precision, compile, export.

Bounds (derived in the chapter):

- tables: float64 within ``2**-50 * (1 + p / scale)`` of NumPy's; float32 within ``2**-24`` of the exact value for
  every position below ``2**24``; float16/bfloat16 equal to the float64 values rounded once.
- rotation, float64: within ``2**-53 * (p + 8) * |pair|`` of NumPy's float64 rotation (angle rounding, then the
  sine, cosine, two products and a sum).
- rotation, float32: within ``(2 + 1/sqrt(2)) * 2**-24 * |pair|`` of the exact rotation, plus the float64
  reference's own error; so <= 1e-6 for pairs of norm <= 6, at every position below ``2**20``.
- rotation, float16/bfloat16: within half a unit in the last place of the dtype (at the exact value's magnitude
  plus the float32 error) plus the float32 bound.
- the relative-score identity ``<R_m q, R_n k> == <R_(m+s) q, R_(n+s) k>`` in float64 to
  ``2**-53 * (m + n + (m+s) + (n+s) + 16 + 2 d) * |q| |k|``.

The peers (tests/rotary_peers.py) are reproduced bitwise when given the same tables, and to their own float32
angle drift (``2**-22 * p`` per unit of pair norm, plus roundings) from positions.
"""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from posenc import RotaryEmbedding, apply_rotary, offset_matrix, rotary, rotary_cos_sin
from posenc.encoding import _round_once
from tests import rotary_peers as peers
from tests.floors import needs_compile, needs_export
from tests.test_compile import recording_backend

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
    positions: torch.Tensor, r: int, base: float = 1e4, scale: float = 1.0
) -> np.ndarray:
    omega = np.power(base, -2.0 * np.arange(r // 2) / r)
    return (positions.numpy().astype(np.float64) / scale)[..., None] * omega


@SETTINGS
@given(
    head_dim=even(2, 256),
    base=bases,
    scale=st.sampled_from([1.0, 0.5, 4.0, 16.0]),
    positions=st.lists(st.integers(0, 2**20), min_size=1, max_size=12),
    layout=layouts,
)
def test_float64_tables_match_numpy(head_dim, base, scale, positions, layout):
    p = torch.tensor(positions)
    cos, sin = rotary_cos_sin(
        p, head_dim, base=base, scale=scale, dtype=torch.float64, layout=layout
    )
    assert cos.shape == sin.shape == (len(positions), head_dim)
    theta = numpy_angles(p, head_dim, base, scale)
    c, s = np.cos(theta), np.sin(theta)
    if layout == "interleaved":
        c, s = np.repeat(c, 2, axis=-1), np.repeat(s, 2, axis=-1)
    else:
        c, s = np.concatenate((c, c), -1), np.concatenate((s, s), -1)
    atol = 2.0**-50 * (1 + max(positions) / scale)
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


def test_peer_recipes_drift_in_float32_and_posenc_does_not():
    torch.manual_seed(5)
    x = torch.randn(1, 1, 64, 128)
    for start, floor in ((65_000, 1e-3), (1_000_000, 2e-2)):
        p = torch.arange(start, start + 64)
        ref = torch.from_numpy(peers.numpy_rotation(x, p, layout="half"))
        hf = (peers.hf_rope(x, p).double() - ref).abs().max().item()
        ours = (apply_rotary(x, p, layout="half").double() - ref).abs().max().item()
        assert hf > floor and ours <= 1e-6, (start, hf, ours)


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


def test_hugging_face_bitwise_with_its_own_tables():
    torch.manual_seed(6)
    q, k = torch.randn(2, 8, 33, 64), torch.randn(2, 2, 33, 64)
    pos = torch.stack([torch.arange(33), torch.arange(100, 133)])
    cos, sin = peers.hf_cos_sin(pos, 64)
    hq, hk = peers.hf_apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(apply_rotary(q, cos=cos, sin=sin, layout="half"), hq)
    assert torch.equal(apply_rotary(k, cos=cos, sin=sin, layout="half"), hk)


def test_lucidrains_bitwise_with_its_own_tables():
    torch.manual_seed(7)
    t = torch.randn(2, 4, 20, 48)
    freqs = torch.einsum(
        "..., f -> ... f",
        (torch.arange(20.0) + 9),
        1.0 / (1e4 ** (torch.arange(0, 32, 2)[:16].float() / 32)),
    )
    freqs = freqs.repeat_interleave(2, -1)
    expected = peers.lucidrains_rotate_queries_or_keys(t, 32, offset=9)
    assert torch.equal(
        apply_rotary(t, cos=freqs.cos(), sin=freqs.sin(), layout="interleaved"),
        expected,
    )


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
def test_peers_from_positions_agree_to_their_float32_drift(offset, rotary_dim):
    torch.manual_seed(9)
    x = torch.randn(2, 4, 40, 64)
    p = torch.arange(offset, offset + 40)
    p_max = offset + 39
    hf = peers.hf_rope(x, p, rotary_dim=rotary_dim)
    ours = apply_rotary(x, offset, layout="half", rotary_dim=rotary_dim)
    assert ((ours - hf).abs() <= drift_tolerance(x, p_max, rotary_dim, "half")).all()
    r = rotary_dim or 64
    luc = peers.lucidrains_rotate_queries_or_keys(x, r, offset=offset)
    ours = apply_rotary(x, offset, rotary_dim=rotary_dim)
    assert ((ours - luc).abs() <= drift_tolerance(x, p_max, rotary_dim)).all()
    if rotary_dim is None:  # the Llama code rotates every channel
        assert (
            (ours - peers.llama_rope(x, start_pos=offset)).abs()
            <= drift_tolerance(x, p_max)
        ).all()


def test_position_interpolation_matches_hugging_face_linear_scaling():
    torch.manual_seed(10)
    x = torch.randn(1, 2, 30, 64)
    p = torch.arange(5000, 5030)
    hf = peers.hf_rope(x, p, scaling_factor=4.0)
    ours = apply_rotary(x, p, layout="half", scale=4.0)
    assert ((ours - hf).abs() <= drift_tolerance(x, 5030, layout="half")).all()
    # scale s at position s * p is the unscaled rotation at p
    assert torch.equal(apply_rotary(x, p * 4, scale=4.0), apply_rotary(x, p))


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
def test_common_case_path_is_bitwise_the_checked_path(layout, rotary_dim, dtype, shape):
    # forward() rotates the common call (q, k of one shape and dtype, float32/float64,
    # positions inside the table) after a few cheap checks; the fully checked path
    # must give the same bits: seq_len 1 reads one row, (2, 64, 33, 16) is past the
    # stacking limit, (0, ...) is empty
    torch.manual_seed(14)
    rope = RotaryEmbedding(16, layout=layout, rotary_dim=rotary_dim, max_len=64)
    q, k = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    for offset in (0, 5, 64 - shape[-2]):
        fast = rope._common_case(q, k, offset)
        assert fast is not None
        slow = rope._forward_checked(q, k, offset, None)
        assert all(torch.equal(a, b) for a, b in zip(fast, slow))
        assert all(a.shape == shape and a.dtype == dtype for a in fast)
    # outside the common case it declines, and forward takes the checked path
    assert rope._common_case(q, k, 64 - shape[-2] + 1) is None  # past the table
    assert rope._common_case(q.half(), k.half(), 0) is None  # rotated in float32
    assert rope._common_case(q, k[..., :1, :], 0) is None or shape[-2] == 1
    kw = {"layout": layout, "rotary_dim": rotary_dim}
    assert torch.equal(rope(q.half(), k.half())[0], apply_rotary(q.half(), **kw))


class _Subclass(torch.Tensor):
    pass


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape", [(1, 4, 1, 16), (2, 3, 6, 16), (6, 16)])
def test_apply_rotary_given_tables_common_case_is_bitwise_the_checked_path(
    layout, dtype, shape
):
    # apply_rotary(x, cos=, sin=) takes a short path when x and the tables share a
    # float32/float64 dtype and a device and rotate every channel; the checked path
    # (forced here by a Tensor subclass, which the short path leaves alone) gives
    # the same bits
    torch.manual_seed(15)
    x = torch.randn(shape, dtype=dtype)
    pos = torch.arange(9, 9 + shape[-2])
    cos, sin = rotary_cos_sin(pos, 16, dtype=dtype, layout=layout)
    assert rotary._rotate_given_tables(x, cos, sin, layout, None) is not None
    fast = apply_rotary(x, cos=cos, sin=sin, layout=layout)
    checked = apply_rotary(x.as_subclass(_Subclass), cos=cos, sin=sin, layout=layout)
    assert checked.__class__ is _Subclass and torch.equal(
        fast, checked.as_subclass(torch.Tensor)
    )
    assert torch.equal(fast, apply_rotary(x, pos, layout=layout))
    other = torch.float64 if dtype == torch.float32 else torch.float32
    # declined (None) outside the common case: each then follows the checked path
    declined = [
        (x, cos.to(other), sin, layout, None),  # tables of another dtype: converted
        (x, cos[:, :8], sin[:, :8], layout, None),  # partial rotary
        (
            x,
            cos,
            sin,
            layout,
            8,
        ),  # rotary_dim disagrees: an error, from the checked path
        (x, cos, sin, "halves", None),  # bad layout: an error, from the checked path
        (x.half(), cos, sin, layout, None),  # rotated in float32
    ]
    for args in declined:
        assert rotary._rotate_given_tables(*args) is None
    with pytest.raises(ValueError, match="rotary_dim=8 does not match"):
        apply_rotary(x, cos=cos, sin=sin, layout=layout, rotary_dim=8)


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
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8, dtype=torch.float64)
    rq, rk = rope(q, k)
    assert rq.dtype == torch.float32 and rk.dtype == torch.float64
    torch.testing.assert_close(rk, apply_rotary(k), rtol=0, atol=1e-7)


def test_state_dict_pickle_deepcopy_and_repr():
    rope = RotaryEmbedding(16, max_len=8, layout="half", rotary_dim=8, scale=2.0)
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
        and "scale=2.0" in repr(rope)
    )
    x = torch.randn(1, 1, 3, 16)
    assert torch.equal(clone(x, x)[0], rope(x, x)[0])


def test_cos_sin_method_matches_the_function():
    rope = RotaryEmbedding(32, rotary_dim=16, layout="half", base=500.0, scale=2.0)
    c1, s1 = rope.cos_sin(torch.arange(9))
    c2, s2 = rotary_cos_sin(9, 32, rotary_dim=16, layout="half", base=500.0, scale=2.0)
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
def inductor_cache(tmp_path, monkeypatch):
    """A private inductor cache: a shared on-disk cache has produced wrong code on this project's machines."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
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
    ("scale 0", lambda: RotaryEmbedding(8, scale=0), ValueError, r"scale.*got 0"),
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
]


@pytest.mark.parametrize(
    ("name", "call", "error", "match"), BAD, ids=[b[0] for b in BAD]
)
def test_bad_inputs_raise_helpful_errors(name, call, error, match):
    with pytest.raises(error, match=match):
        call()


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
