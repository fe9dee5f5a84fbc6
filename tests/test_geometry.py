"""The geometry of the encoding (book/04_geometry.ipynb): PE[p] . PE[p+k] = sum_i cos(k w_i) depends on k only and
is symmetric in k; |PE[p]| = sqrt(d/2); values in [-1, 1]; the distance between two positions depends on their
offset only, so the minimum over N positions is a minimum over N - 1 offsets. Property-based over d_model 2..1024,
bases 10..1e6, positions up to 2^20, float32 and float64; each tolerance is derived next to it."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import frequencies, sinusoidal_encoding

U64 = 2.0**-53  # float64 unit roundoff
d_models = st.integers(2, 1024)
bases = st.floats(1.0, 6.0).map(lambda e: 10.0**e)  # log-uniform in [10, 1e6]
positions = st.integers(0, 2**20)
offsets = st.integers(-(2**16), 2**16)
dtypes = st.sampled_from([torch.float32, torch.float64])
schedules = st.sampled_from(["paper", "tensor2tensor"])
SETTINGS = settings(
    max_examples=100, deadline=None, database=None
)  # no .hypothesis/ written into the checkout


def dot_tolerance64(d_model: int, omega: torch.Tensor, p: int, k: int) -> float:
    """Bound on |PE[p] . PE[p+k] - sum_i cos(k w_i)| in float64.

    Pair i: sin(A) sin(B) + cos(A) cos(B) = cos(B - A) exactly; the angles A = p w_i, B = (p+k) w_i and k w_i are
    each rounded (<= U64 |m| w_i each, sine and cosine are 1-Lipschitz), summed over pairs: U64 (p + |p+k| + |k|)
    sum_i w_i. Evaluation: 4 sines/cosines within 2 U64 and 3 roundings per pair (<= 11 U64 per pair), and two
    sums of at most d terms of size <= 1, each within (d - 1) U64 * sum |terms| <= d U64 * d/2.
    """
    m = d_model // 2
    return (
        U64 * (p + abs(p + k) + abs(k)) * omega[:m].sum().item()
        + 11 * U64 * m
        + 2 * d_model * U64 * m
    )


@SETTINGS
@given(
    d_model=d_models,
    base=bases,
    p=st.lists(positions, min_size=2, max_size=8),
    k=offsets,
    dtype=dtypes,
    schedule=schedules,
)
def test_dot_product_depends_on_the_offset_only(
    d_model: int, base: float, p: list[int], k: int, dtype: torch.dtype, schedule: str
) -> None:
    p_t = torch.tensor(p)
    k = max(k, -min(p))
    kwargs = {
        "base": base,
        "frequencies": schedule,
        "layout": "concat",
    }  # the concat layout makes pairs easy to slice
    a = sinusoidal_encoding(p_t, d_model, dtype=dtype, **kwargs).double()
    b = sinusoidal_encoding(p_t + k, d_model, dtype=dtype, **kwargs).double()
    m = d_model // 2
    # the paired channels: sines 0..m-1 and cosines at ceil(d/2)..ceil(d/2)+m-1 (tensor2tensor odd: m..2m-1)
    cos_start = (
        m if (schedule == "tensor2tensor" and d_model % 2) else (d_model + 1) // 2
    )
    paired = list(range(m)) + list(range(cos_start, cos_start + m))
    dots = (a[:, paired] * b[:, paired]).sum(-1)  # float64 accumulation
    omega = frequencies(d_model, base=base, schedule=schedule)
    formula = torch.cos(k * omega[:m]).sum().item()
    tolerance = dot_tolerance64(d_model, omega, max(p), k)
    if dtype == torch.float32:
        # each float32 entry is within 2^-25 of its float64 value (|v| <= 1); the dot product then errs by
        # <= 2^-25 (sum |a_j| + sum |b_j|) + d 2^-50 <= 2^-25 * 2 * sqrt(d) * sqrt(d/2) = 2^-25 sqrt(2) d
        # (Cauchy-Schwarz with |a| = |b| = sqrt(d/2)).
        tolerance += 2**-25 * math.sqrt(2) * d_model + d_model * 2**-50
    assert (dots - formula).abs().max().item() <= tolerance
    # symmetric in k: the formula is even in k (cosine is even), so PE[p].PE[p+k] == PE[p].PE[p-k] within 2x the
    # tolerance whenever p - k >= 0 as well
    if min(p) - k >= 0:
        c = sinusoidal_encoding(p_t - k, d_model, dtype=dtype, **kwargs).double()
        assert (
            (a[:, paired] * c[:, paired]).sum(-1) - dots
        ).abs().max().item() <= 2 * tolerance + 2 * d_model * U64 * m


@SETTINGS
@given(
    d_model=d_models,
    base=bases,
    p=st.lists(positions, min_size=1, max_size=16),
    dtype=dtypes,
    schedule=schedules,
)
def test_norm_is_sqrt_half_d(
    d_model: int, base: float, p: list[int], dtype: torch.dtype, schedule: str
) -> None:
    values = sinusoidal_encoding(
        torch.tensor(p), d_model, base=base, dtype=dtype, frequencies=schedule
    ).double()
    sq_norm = (values**2).sum(-1)
    m = d_model // 2
    # float64: per pair sin^2 + cos^2 = 1 up to 2 * 2 U64 * (|s| + |c|) <= 4 sqrt(2) U64 for the evaluations and
    # 3 roundings (< 9 U64), plus a sum of d terms <= 1: d U64 * d/2.
    tolerance = 9 * U64 * m + d_model * U64 * m
    if dtype == torch.float32:
        # each value is rounded to within a relative 2^-24, its square to within 2 * 2^-24 (+ 2^-48): the sum of
        # squares to within 2^-23 (1 + 2^-24) * |PE|^2 <= 2^-23 (1 + 2^-24) (d + 1) / 2
        tolerance += 2**-23 * (1 + 2**-24) * (d_model + 1) / 2
    if d_model % 2 == 0 or schedule == "tensor2tensor":
        # even: d/2 pairs on the unit circle; tensor2tensor odd: the extra channel is sin(p * 0) = 0
        assert (sq_norm - m).abs().max().item() <= tolerance
    else:
        # paper odd: the unpaired sine adds sin^2(p w_u) in [0, 1]
        assert (
            sq_norm.min().item() >= m - tolerance
            and sq_norm.max().item() <= m + 1 + tolerance
        )


@settings(max_examples=100, deadline=None, database=None)
@given(
    d_model=st.integers(1, 1024),
    base=bases,
    p=st.lists(st.integers(0, 2**40), min_size=1, max_size=16),
    dtype=st.sampled_from(
        [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    ),
    layout=st.sampled_from(["interleaved", "concat"]),
    schedule=schedules,
)
def test_values_are_in_minus_one_one(
    d_model: int,
    base: float,
    p: list[int],
    dtype: torch.dtype,
    layout: str,
    schedule: str,
) -> None:
    # exact: sines and cosines are in [-1, 1], and rounding to any float format cannot leave it, as +-1 are
    # representable
    values = sinusoidal_encoding(
        torch.tensor(p),
        d_model,
        base=base,
        dtype=dtype,
        layout=layout,
        frequencies=schedule,
    )
    assert values.abs().max().item() <= 1.0
    assert torch.isfinite(values).all()


def distance_by_offset(
    n_positions: int, d_model: int, base: float = 10000.0
) -> torch.Tensor:
    """|PE[p] - PE[p+k]| = sqrt(2 sum_i (1 - cos(k w_i))) for k = 1..n_positions-1 (even d_model), float64."""
    omega = frequencies(d_model, base=base)
    k = torch.arange(1, n_positions, dtype=torch.float64)
    return torch.cat(
        [
            (2 * (1 - torch.cos(chunk[:, None] * omega)).sum(-1)).sqrt()
            for chunk in k.split(20_000)
        ]
    )


def test_distance_depends_on_the_offset_only_brute_force() -> None:
    # brute force over all pairs of the first 1,500 positions equals the minimum over offsets; the squared
    # distances differ by the same angle rounding as the dot product (<= 1e-11 here), the roots by less than
    # that divided by the distance (>= 0.04)
    for d_model, base in ((4, 1e4), (16, 100.0), (64, 1e4)):
        table = sinusoidal_encoding(1500, d_model, base=base, dtype=torch.float64)
        brute = torch.cdist(table, table).fill_diagonal_(float("inf")).min().item()
        assert abs(brute - distance_by_offset(1500, d_model, base).min().item()) <= 1e-9


def test_minimum_distance_over_100000_positions() -> None:
    # the chapter's numbers: for d_model >= 16 the nearest position is the neighbour (k = 1), at distance
    # sqrt(2 sum_i (1 - cos w_i)); for d_model = 2 a near-collision at k = 710 ~ 226 pi
    dist = distance_by_offset(100_000, 64)
    assert int(dist.argmin()) + 1 == 1
    omega = frequencies(64)
    assert (
        abs(dist.min().item() - math.sqrt(2 * (1 - torch.cos(omega)).sum().item()))
        <= 1e-12
    )
    assert 1.4718 <= dist.min().item() <= 1.4719
    tiny = distance_by_offset(100_000, 2)
    assert int(tiny.argmin()) + 1 == 710 and tiny.min().item() < 1e-4
