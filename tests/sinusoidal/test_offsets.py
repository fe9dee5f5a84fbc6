"""posenc.offset_matrix: PE[p + k] = M_k PE[p] (linearity), the group structure, odd widths, every layout and
schedule, shapes and argument errors. Property-based over d_model 2..1024, bases 10..1e6, positions up to 2^20,
float32 and float64; each tolerance is derived next to it (see book/03_relative_offsets.ipynb)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import frequencies, offset_matrix, sinusoidal_encoding
from posenc.sinusoidal.offsets import _pair_channels

U64 = (
    2.0**-53
)  # float64 unit roundoff: a correctly rounded result is within U64 * |x| of x
U32 = 2.0**-24  # float32 unit roundoff

d_models = st.integers(2, 1024)
bases = st.floats(1.0, 6.0).map(lambda e: 10.0**e)  # log-uniform in [10, 1e6]
positions = st.integers(0, 2**20)
offsets = st.integers(-(2**16), 2**16)
layouts = st.sampled_from(["interleaved", "half"])
schedules = st.sampled_from(["paper", "tensor2tensor"])
dtypes = st.sampled_from([torch.float32, torch.float64])
SETTINGS = settings(
    max_examples=40, deadline=None, database=None
)  # no .hypothesis/ written into the checkout


def angle_tolerance64(*magnitudes: float) -> float:
    """Bound on |lhs - rhs| for an identity between sines/cosines of float64 angles m * omega_i.

    Both sides use the same rounded omega_i <= 1, for which the identity is exact; what differs is the rounding
    of each angle product m * omega_i (at most U64 * |m| * omega_i <= U64 * |m|; sine and cosine are
    1-Lipschitz), plus the evaluation: sin/cos within 1 ulp (<= 2 * U64 for values <= 1) on up to 4 values
    weighted by |cos| + |sin| <= sqrt(2), and a two-term dot product (3 roundings). 4*sqrt(2) + 3 + 2 < 11,
    rounded up to 16 units.
    """
    return U64 * sum(abs(m) for m in magnitudes) + 16 * U64


def float32_linearity_tolerance(p: int, k: int) -> float:
    """Bound on |M_k PE[p] - PE[p + k]| with every operand float32 (posenc rounds float64 values once).

    Each entry of M_k and PE is within half a float32 ulp of its float64 value, <= 2^-25 for |v| <= 1. A row
    c*x + s*y then errs by (|c| + |s|) 2^-25 + (|x| + |y|) 2^-25 <= 2 sqrt(2) 2^-25 from the rounded inputs,
    2 U32 (|cx| + |sy|) <= 2 U32 from the float32 products and sum, and 2^-25 from the rounded PE[p + k]; plus
    the float64 error of the values themselves.
    """
    return 2 * math.sqrt(2) * 2**-25 + 2 * U32 + 2**-25 + angle_tolerance64(p, k, p + k)


def paired_channels(d_model: int, layout: str, schedule: str) -> list[int]:
    """Channels on which linearity is exact: all but the paper schedule's unpaired sine (odd d_model)."""
    unpaired = _pair_channels(d_model, layout, schedule)[2]
    return [c for c in range(d_model) if not (schedule == "paper" and c == unpaired)]


@settings(max_examples=100, deadline=None, database=None)
@given(
    d_model=d_models,
    base=bases,
    p=positions,
    k=offsets,
    layout=layouts,
    schedule=schedules,
    dtype=dtypes,
)
def test_linearity(
    d_model: int,
    base: float,
    p: int,
    k: int,
    layout: str,
    schedule: str,
    dtype: torch.dtype,
) -> None:
    k = max(k, -p)  # positions are >= 0
    kwargs = {"base": base, "layout": layout, "schedule": schedule}
    moved = offset_matrix(k, d_model, dtype=dtype, **kwargs) @ sinusoidal_encoding(
        torch.tensor(p), d_model, dtype=dtype, **kwargs
    )
    target = sinusoidal_encoding(torch.tensor(p + k), d_model, dtype=dtype, **kwargs)
    channels = paired_channels(d_model, layout, schedule)
    error = (moved - target)[channels].abs().max().item()
    tolerance = (
        angle_tolerance64(p, k, p + k)
        if dtype == torch.float64
        else float32_linearity_tolerance(p, k)
    )
    assert error <= tolerance, (error, tolerance)


@settings(max_examples=30, deadline=None, database=None)
@given(
    d_model=st.integers(1, 512).filter(lambda d: d % 2 == 1),
    base=bases,
    p=positions,
    k=offsets,
    layout=layouts,
)
def test_odd_width_unpaired_sine_is_kept_within_k_omega(
    d_model: int, base: float, p: int, k: int, layout: str
) -> None:
    # With the paper schedule the unpaired channel sin(p w_u) is mapped by the identity; the error is
    # |sin((p+k) w_u) - sin(p w_u)| <= |k| w_u (sine is 1-Lipschitz), plus the angle rounding of both sides.
    k = max(k, -p)
    unpaired = _pair_channels(d_model, layout, "paper")[2]
    moved = offset_matrix(k, d_model, base=base, layout=layout) @ sinusoidal_encoding(
        torch.tensor(p), d_model, base=base, dtype=torch.float64, layout=layout
    )
    target = sinusoidal_encoding(
        torch.tensor(p + k), d_model, base=base, dtype=torch.float64, layout=layout
    )
    omega_u = frequencies(d_model, base=base)[-1].item()
    assert abs(moved[unpaired] - target[unpaired]).item() <= abs(
        k
    ) * omega_u + angle_tolerance64(p, p + k)


def test_tensor2tensor_odd_width_is_exact_on_every_channel() -> None:
    # the unpaired channel is sin(p * 0) = 0, kept by the identity exactly
    p = torch.arange(0, 2**20, 997)
    for d_model in (1, 3, 7, 513):
        for layout in ("interleaved", "half"):
            kwargs = {"layout": layout, "schedule": "tensor2tensor"}
            table = sinusoidal_encoding(p, d_model, dtype=torch.float64, **kwargs)
            moved = table @ offset_matrix(-500, d_model, **kwargs).T
            target = sinusoidal_encoding(
                (p - 500).clamp_min(0), d_model, dtype=torch.float64, **kwargs
            )
            ok = p >= 500
            assert (moved[ok] - target[ok]).abs().max().item() <= angle_tolerance64(
                2**20, 500, 2**20
            )


@SETTINGS
@given(
    d_model=d_models,
    base=bases,
    a=offsets,
    b=offsets,
    layout=layouts,
    schedule=schedules,
    dtype=dtypes,
)
def test_group_structure(
    d_model: int,
    base: float,
    a: int,
    b: int,
    layout: str,
    schedule: str,
    dtype: torch.dtype,
) -> None:
    kwargs = {"base": base, "layout": layout, "schedule": schedule, "dtype": dtype}
    m_a, m_b = offset_matrix(a, d_model, **kwargs), offset_matrix(b, d_model, **kwargs)
    # M_a M_b = M_(a+b): R(a w) R(b w) = R((a+b) w) exactly for the same rounded w; the angle products a w, b w,
    # (a+b) w are rounded (same bound as linearity), and each block entry is a two-term dot product. In float32
    # the entries are rounded once more and the product is float32: the linearity bound's float32 terms again.
    error = (m_a @ m_b - offset_matrix(a + b, d_model, **kwargs)).abs().max().item()
    float64 = dtype == torch.float64
    assert error <= (
        angle_tolerance64(a, b, a + b) if float64 else float32_linearity_tolerance(a, b)
    )
    # M_(-a) = M_a^T: fl(-a w) = -fl(a w) exactly; sin(-x) and -sin(x) are each within 1 ulp (<= 2 U64) of the
    # true value, so they differ by at most 4 U64 (0 where the library's sine is exactly odd); rounded to float32
    # (symmetrically, to nearest), two such values differ by at most one float32 ulp, <= 2^-24 for |v| <= 1.
    transpose_error = (offset_matrix(-a, d_model, **kwargs) - m_a.T).abs().max().item()
    assert transpose_error <= (4 * U64 if float64 else 2**-24)
    # orthogonal: each block gives cos^2 + sin^2 = 1 up to the sin/cos errors (2 * 2 U64 * (|c| + |s|) <=
    # 4 sqrt(2) U64) and 3 roundings of the 2-term sum; off-block entries are exact zeros. float32: the rounded
    # entries add 2 * 2^-25 (|c| + |s|) <= 2 sqrt(2) 2^-25, and the float32 arithmetic 3 U32.
    eye = torch.eye(d_model, dtype=dtype)
    orthogonality = (m_a.T @ m_a - eye).abs().max().item()
    assert orthogonality <= (
        16 * U64 if float64 else 2 * math.sqrt(2) * 2**-25 + 3 * U32 + 16 * U64
    )


@settings(max_examples=20, deadline=None, database=None)
@given(d_model=d_models, base=bases, layout=layouts, schedule=schedules)
def test_zero_offset_is_the_identity(
    d_model: int, base: float, layout: str, schedule: str
) -> None:
    # cos(0) = 1 and sin(0) = 0 exactly in every math library
    m_0 = offset_matrix(0, d_model, base=base, layout=layout, schedule=schedule)
    assert torch.equal(m_0, torch.eye(d_model, dtype=torch.float64))


def test_ten_thousand_random_offsets_float64() -> None:
    # the chapter's check, d_model = 16: every error within its own angle-rounding bound
    gen = torch.Generator().manual_seed(1)
    p = torch.randint(0, 2**20, (10_000,), generator=gen)
    k = torch.maximum(torch.randint(-(2**16) + 1, 2**16, (10_000,), generator=gen), -p)
    moved = (
        offset_matrix(k, 16)
        @ sinusoidal_encoding(p, 16, dtype=torch.float64)[..., None]
    ).squeeze(-1)
    error = (moved - sinusoidal_encoding(p + k, 16, dtype=torch.float64)).abs().amax(-1)
    bound = U64 * (p + k.abs() + (p + k)).double() + 16 * U64
    assert bool((error <= bound).all())
    assert (k < 0).sum() > 4000, "negative offsets are covered"


def test_block_structure_and_defaults() -> None:
    m = offset_matrix(1, 4, base=100.0)
    omega = frequencies(4, base=100.0)
    c, s = torch.cos(omega), torch.sin(omega)
    expected = torch.tensor(
        [
            [c[0], s[0], 0, 0],
            [-s[0], c[0], 0, 0],
            [0, 0, c[1], s[1]],
            [0, 0, -s[1], c[1]],
        ],
        dtype=torch.float64,
    )
    assert torch.equal(m, expected)
    assert torch.equal(
        offset_matrix(5, 6),
        offset_matrix(5, 6, base=10000.0, layout="interleaved", schedule="paper"),
    )
    # half layout: the same blocks at channels (i, d/2 + i)
    mc = offset_matrix(1, 4, base=100.0, layout="half")
    assert (
        mc[0, 0] == c[0] and mc[0, 2] == s[0] and mc[2, 0] == -s[0] and mc[1, 3] == s[1]
    )


def test_shapes_dtypes_devices() -> None:
    assert offset_matrix(3, 8).shape == (8, 8)
    assert offset_matrix(3, 8).dtype == torch.float64
    assert offset_matrix(3, 8, dtype=torch.float32).dtype == torch.float32
    batch = offset_matrix(torch.tensor([[1, -2, 3], [0, 5, 6]]), 5)
    assert batch.shape == (2, 3, 5, 5)
    assert torch.equal(batch[0, 1], offset_matrix(-2, 5))
    assert offset_matrix(torch.tensor(4), 6).shape == (6, 6)
    assert offset_matrix(torch.tensor([], dtype=torch.long), 4).shape == (0, 4, 4)
    assert offset_matrix(2, 4, device="cpu").device.type == "cpu"
    assert torch.equal(
        offset_matrix(torch.tensor(7, dtype=torch.int32), 4), offset_matrix(7, 4)
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"offset": 1.5}, TypeError, "offset"),
        ({"offset": True}, TypeError, "offset"),
        ({"offset": torch.tensor([1.0])}, TypeError, "offset"),
        ({"offset": 1, "d_model": 0}, ValueError, "d_model"),
        ({"offset": 1, "d_model": 4.0}, TypeError, "d_model"),
        ({"offset": 1, "base": 1.0}, ValueError, "base"),
        ({"offset": 1, "layout": "split"}, ValueError, "layout"),
        ({"offset": 1, "schedule": "fairseq"}, ValueError, "schedule"),
        ({"offset": 1, "dtype": torch.int64}, TypeError, "dtype"),
    ],
)
def test_argument_errors_name_the_argument(
    kwargs: dict, error: type, names: str
) -> None:
    kwargs = {"d_model": 8, **kwargs}
    with pytest.raises(error, match=names):
        offset_matrix(**kwargs)


def test_the_docstring_reads_as_plain_text() -> None:
    """help(offset_matrix) shows the docstring raw: its math is plain Unicode (M_k, θ = k·ω_i), never LaTeX."""
    doc = offset_matrix.__doc__ or ""
    assert "$" not in doc and not re.search(r"\\[A-Za-z]+", doc)
    assert "M_k" in doc and "θ = k·ω_i" in doc
