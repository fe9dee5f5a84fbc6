"""The geometry of the encoding (book/04_geometry.ipynb): PE[p] . PE[p+k] = sum_i cos(k w_i) depends on k only and
is symmetric in k; |PE[p]| = sqrt(d/2); values in [-1, 1]; the distance between two positions depends on their
offset only, so the minimum over N positions is a minimum over N - 1 offsets, and that minimum is at k = 1 only for
some N (Dirichlet's bound drives it to 0), and the smallest distance per octave of offsets follows no simple law (the
chapter's table); one attention head with A = W_Q W_K^T / sqrt(d_k) = M_j P_S has rank d_k and a position-position
score that depends on k only and peaks at k = -j. Vectors are columns, as in the book. Property-based over d_model
2..1024, bases 10..1e6, positions up to 2^20, float32 and float64; each tolerance is derived next to it."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import frequencies, offset_matrix, sinusoidal_encoding

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
        "schedule": schedule,
        "layout": "half",
    }  # the half layout makes pairs easy to slice
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
        torch.tensor(p), d_model, base=base, dtype=dtype, schedule=schedule
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
    layout=st.sampled_from(["interleaved", "half"]),
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
        schedule=schedule,
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


def distance_by_offset_blocked(
    n_positions: int, d_model: int, base: float = 10000.0
) -> torch.Tensor:
    """The same distances for large N: with k = aB + b, cos(k w) = cos(aB w) cos(b w) - sin(aB w) sin(b w), two
    [N/B, d/2] x [d/2, B] products (the chapter's shortcut), float64: [n_positions - 1]."""
    omega = frequencies(d_model, base=base)
    block = math.isqrt(n_positions) + 1
    coarse = torch.arange(0, n_positions, block, dtype=torch.float64)[:, None] * omega
    fine = torch.arange(block, dtype=torch.float64)[:, None] * omega
    dot = torch.cos(coarse) @ torch.cos(fine).T - torch.sin(coarse) @ torch.sin(fine).T
    return (2 * (len(omega) - dot.flatten()[1:n_positions])).clamp_min(0).sqrt()


def test_the_neighbour_stops_being_the_nearest_for_larger_n() -> None:
    # the chapter's numbers: d_model = 16, base 100 has a far offset closer than the neighbour below 2^20; for
    # d_model = 64 (base 1e4) the neighbour is still the nearest among the first 2^22 positions. The distances are
    # >= 0.45 and each runner-up is >= 0.35 away, far above the float64 rounding of angles below 2^23 (< 1e-8).
    dist = distance_by_offset(2**20, 16, 100.0)
    k = int(dist.argmin()) + 1
    assert k == 618_328
    assert 0.4504 <= dist.min().item() <= 0.4506 < dist[0].item()
    # the blocked form agrees with the direct one, then reaches 2^22 quickly
    blocked = distance_by_offset_blocked(2**20, 16, 100.0)
    assert (blocked - dist).abs().max().item() <= 1e-8
    wide = distance_by_offset_blocked(2**22, 64)
    assert int(wide.argmin()) + 1 == 1


@settings(max_examples=30, deadline=None, database=None)
@given(m=st.integers(1, 3), base=bases, q=st.integers(2, 12), p=st.integers(0, 2**20))
def test_dirichlet_bound_on_the_smallest_distance(
    m: int, base: float, q: int, p: int
) -> None:
    # eq-dirichlet: some 1 <= k <= Q^m has ||PE[p] - PE[p+k]|| <= 2 sqrt(m) sin(pi / Q), for any frequencies;
    # the computed distance errs by the angle rounding of p w and (p + k) w, <= 2^-53 * 2^22 per channel (p, k
    # < 2^21, w <= 1), so by < 1e-9 over at most 6 channels
    d_model = 2 * m
    n = q**m
    table = sinusoidal_encoding(
        torch.arange(p, p + n + 1), d_model, base=base, dtype=torch.float64
    )
    distances = (table[1:] - table[0]).norm(dim=-1)  # k = 1 .. Q^m
    assert distances.min().item() <= 2 * math.sqrt(m) * math.sin(math.pi / q) + 1e-8


@SETTINGS
@given(
    half_d=st.integers(2, 128),
    base=bases,
    j=st.integers(-64, 64),
    data=st.data(),
    p=st.lists(st.integers(64, 2**20), min_size=2, max_size=8),
)
def test_one_head_realises_the_shifted_score_on_its_pairs(
    half_d: int, base: float, j: int, data: st.DataObject, p: list[int]
) -> None:
    # W_Q = sqrt(d_k) times the columns of M_j for the head's pairs S, W_K = the same columns of I: A = W_Q W_K^T /
    # sqrt(d_k) = M_j P_S has rank 2|S| = d_k, and the score (W_Q^T PE[p])^T (W_K^T PE[p+k]) / sqrt(d_k) =
    # sum_{i in S} cos((k + j) w_i) for every p (eq-head-score), largest (= |S|) at k = -j. Tolerance: the angle
    # rounding of p w, (p+k) w and j w (U64 (p + |p+k| + |j|) w per pair), plus the two matrix products over d
    # channels and the sum over S (<= 4 d U64 per pair), plus scaling by sqrt(d_k) and back (<= 4 U64 per pair).
    d_model = 2 * half_d
    pairs = sorted(
        data.draw(
            st.sets(st.integers(0, half_d - 1), min_size=1, max_size=half_d), label="S"
        )
    )
    k = data.draw(st.integers(-63, 63), label="k")
    idx = torch.tensor(pairs)
    channels = torch.stack([2 * idx, 2 * idx + 1], -1).flatten()
    d_k = len(channels)
    m_j = offset_matrix(j, d_model, base=base)
    w_q = math.sqrt(d_k) * m_j[:, channels]
    w_k = torch.eye(d_model, dtype=torch.float64)[:, channels]
    # rank d_k: A's columns outside the head's channels are zero, and those inside are M_j's, which are
    # orthonormal (columns of the orthogonal M_j)
    a = w_q @ w_k.T / math.sqrt(d_k)
    others = torch.ones(d_model, dtype=torch.bool)
    others[channels] = False
    assert (a[:, channels] - m_j[:, channels]).abs().max().item() <= 4 * U64
    assert not a[:, others].any()
    eye = torch.eye(d_k, dtype=torch.float64)
    assert (m_j[:, channels].T @ m_j[:, channels] - eye).abs().max().item() <= 16 * U64
    p_t = torch.tensor(p)
    f64 = {"base": base, "dtype": torch.float64}
    queries = sinusoidal_encoding(p_t, d_model, **f64) @ w_q  # rows (W_Q^T PE[p])^T
    keys = sinusoidal_encoding(p_t + k, d_model, **f64) @ w_k
    score = (queries * keys).sum(-1) / math.sqrt(d_k)
    omega = frequencies(d_model, base=base)[idx]
    formula = torch.cos((k + j) * omega).sum().item()
    tolerance = U64 * (2 * max(p) + 2 * abs(k) + abs(j)) * omega.sum().item()
    tolerance += 4 * d_model * U64 * len(pairs) + 4 * U64 * len(pairs)
    assert (score - formula).abs().max().item() <= tolerance
    assert torch.cos(0 * omega).sum().item() == len(pairs) >= formula


def _smallest_per_octave(d_model: int, base: float) -> list[float]:
    """The smallest ||PE[p] - PE[p + k]|| over each octave 2^j <= k < 2^(j+1), j < 20 (the chapter's table)."""
    dist = distance_by_offset_blocked(2**20, d_model, base)
    return [dist[2**j - 1 : 2 ** (j + 1) - 1].min().item() for j in range(20)]


def test_the_smallest_distance_per_octave_as_the_chapter_states() -> None:
    # The chapter's sentences about its per-octave table, number by number. Every two values compared here differ
    # by at least 0.0025 (measured), far above the float64 rounding of angles below 2^21 (< 1e-9), so each
    # comparison holds on any machine.
    table = {
        (d, base): _smallest_per_octave(d, base)
        for d in (16, 64)
        for base in (100.0, 1e4)
    }
    expected = {  # (largest in octave, falls before it, rises after it)
        (16, 100.0): (5, [], [13, 14]),
        (16, 1e4): (11, [2, 4, 7, 9], [13]),
        (64, 100.0): (6, [], [9, 14]),
        (64, 1e4): (13, [12], [15]),
    }
    for (d, base), values in table.items():
        peak = max(range(20), key=values.__getitem__)
        falls = [i + 1 for i in range(peak) if values[i + 1] < values[i]]
        rises = [i + 1 for i in range(peak, 19) if values[i + 1] > values[i]]
        assert (peak, falls, rises) == expected[d, base], (d, base)
        octave_of_2pi_base = int(math.log2(2 * math.pi * base))
        assert 2 <= octave_of_2pi_base - peak <= 4
        neighbour = values[0]  # octave 0 is k = 1 alone
        below = [j for j in range(1, 20) if values[j] < neighbour]
        assert below == ({(16, 100.0): [18, 19], (16, 1e4): [19]}.get((d, base), [])), (
            d,
            base,
        )
    assert [round(v, 3) for v in table[64, 1e4][11:16]] == [
        6.553,
        6.548,
        6.739,
        6.184,
        6.209,
    ]
    assert [int(math.log2(2 * math.pi * b)) for b in (100.0, 1e4)] == [9, 15]
