"""Precision bounds of the encoding (book/10_precision.ipynb), for the function and the module.

- float32: within ``6e-8`` (two float32 rounding steps near 1) of the float64 value at every position below
  ``2**24``, for every ``d_model``, layout and frequency schedule.
- float64: within ``2**-50 * p`` of an independent float64 evaluation (two float64 evaluations of the angle
  ``p * omega`` may differ by a few units in the last place of ``omega``, times ``p``).
- float16 / bfloat16: the float64 value rounded **once** to the dtype. The reference is posenc's own float64
  output rounded by NumPy's direct float64 -> float16 conversion, or by round-to-nearest-even on the float64 bits
  for bfloat16 (NumPy has no bfloat16). Comparing with a rounding of an *independent* float64 evaluation could
  fail for no fault of posenc: two correct float64 values ~1e-16 apart straddle a half-precision rounding
  midpoint now and then, and round to neighbouring half-precision numbers. So the float64 output is checked
  against the independent reference separately (to ~1e-9), and its single rounding is checked for equality.

The float64 references are NumPy (or mpmath, exact, on sampled points), in tests/references/exact.py:
independent of posenc's code path.
CUDA tests are marked ``gpu`` (tests/conftest.py skips them without CUDA).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from posenc import PositionalEncoding, sinusoidal_encoding
from tests.references.exact import (
    exact_encoding,
    half_ulp,
    numpy_encoding,
    numpy_omega,
    round_once,
)
from tests.references.floors import needs_compile

FLOAT32_BOUND = 6e-8  # two float32 rounding steps near 1 (2**-24 = 5.96e-8)
HALF = (torch.float16, torch.bfloat16)

# Known inputs where Tensor.to (float64 -> float32 -> half, two roundings) lands one unit away from the single
# rounding, found by a sweep (d_model=512; channel: float64 value, what .to gives, what one rounding gives):
#   float16:  p=35, channel 242: 0.4351806661751879 -> 0.43505859375 instead of 0.435302734375
#   bfloat16: p=45, channel 111: 0.9980468683113846 -> 1.0 instead of 0.99609375
# posenc rounds to float32 *to odd* first (book/01_derivation.ipynb, `_round_once`); these are regression tests.
KNOWN_DOUBLE_ROUNDING = {
    torch.float16: (35, 242, 0.435302734375),
    torch.bfloat16: (45, 111, 0.99609375),
}


def half_params() -> list:
    """float16 and bfloat16 as params."""
    return [pytest.param(dtype, id=dtype_id(dtype)) for dtype in HALF]


def dtype_id(value: object) -> str | None:
    """Test ids: 'float16' rather than 'dtype0'."""
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else None


def check(
    got: torch.Tensor,
    positions: np.ndarray,
    d_model: int,
    *,
    once: bool = False,
    **kwargs: str,
) -> None:
    """Assert the precision contract of ``got`` ([*positions.shape, d_model], any dtype) against NumPy.

    float32: within FLOAT32_BOUND; float64: within 2**-50 * p. Half dtypes: within half a unit of the dtype plus
    half a float32 unit (holds for the double rounding of Tensor.to too) or, with ``once=True``, equal to the
    single rounding of posenc's float64 output (which must itself be within 2**-50 * p of NumPy).
    """
    reference = numpy_encoding(positions, d_model, **kwargs)
    scale = (
        2.0**-50 * np.maximum(np.asarray(positions, dtype=np.float64), 1.0)[..., None]
    )
    value = got.cpu().double().numpy()
    if got.dtype == torch.float32:
        err = np.abs(value - reference).max()
        assert err <= FLOAT32_BOUND, f"float32 error {err:.3e} > {FLOAT32_BOUND}"
    elif got.dtype == torch.float64:
        excess = (np.abs(value - reference) - scale).max()
        assert excess <= 0, f"float64 error exceeds 2**-50 * p by {excess:.3e}"
    elif once:
        positions_t = torch.as_tensor(positions, device=got.device)
        as_float64 = (
            sinusoidal_encoding(positions_t, d_model, dtype=torch.float64, **kwargs)
            .cpu()
            .numpy()
        )
        assert (np.abs(as_float64 - reference) - scale).max() <= 0, (
            "posenc's float64 output is off"
        )
        want = round_once(as_float64, got.dtype)
        bad = np.argwhere(value != want)
        first = tuple(int(i) for i in bad[0]) if len(bad) else ()
        assert len(bad) == 0, (
            f"{len(bad)} of {value.size} values are not the float64 value rounded once to {got.dtype}; first at "
            f"index {first}: float64 {float(as_float64[first])!r}, got {float(value[first])!r}, "
            f"rounded once {float(want[first])!r}"
        )
    else:
        allowed = (
            half_ulp(reference, got.dtype) + half_ulp(reference, torch.float32) + scale
        )
        excess = (np.abs(value - reference) - allowed).max()
        assert excess <= 0, (
            f"{got.dtype} error exceeds half a unit (+ float32 rounding) by {excess:.3e}"
        )


# ----------------------------------------------------------------------------------------------------------
# The references themselves
# ----------------------------------------------------------------------------------------------------------


def test_references_agree_with_exact_values_and_torch_conversions() -> None:
    positions = [0, 1, 35, 4974, 2**20 - 1, 2**24 - 1]
    exact = exact_encoding(positions, 16)
    assert np.abs(numpy_encoding(np.array(positions), 16) - exact).max() < 1e-8
    # on values already in float32, a single rounding is what torch does too (float32 -> half is one step)
    scales = 2.0 ** torch.arange(-40, 10).repeat(2000)
    values = torch.randn(100_000, generator=torch.Generator().manual_seed(0)) * scales
    for dtype in HALF:
        assert np.array_equal(
            round_once(values.double().numpy(), dtype),
            values.to(dtype).double().numpy(),
        )
    # a float64 value just above a float16 midpoint: float32 would round it onto the midpoint, a tie
    above_midpoint = np.array([1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-40])
    assert round_once(above_midpoint[:1], torch.float16)[0] == 1 + 2**-10
    assert round_once(above_midpoint[1:], torch.bfloat16)[0] == 1 + 2**-7


# ----------------------------------------------------------------------------------------------------------
# float32 and float64: sweeps and samples
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d_model", [2, 7, 64])
def test_float32_every_position_below_2_to_20(d_model: int) -> None:
    """Every position below 2**20: d_model=2 (omega = 1, the angle is p itself), 7 (odd, unpaired last sine,
    frequencies base**(-2i/7) that are not dyadic) and 64 (32 frequencies, shared with every d_model = 64k)."""
    chunk = 2**21 // d_model
    worst = 0.0
    for start in range(0, 2**20, chunk):
        positions = np.arange(start, start + chunk)
        got = sinusoidal_encoding(torch.from_numpy(positions), d_model).numpy()
        worst = max(
            worst, float(np.abs(got - numpy_encoding(positions, d_model)).max())
        )
    assert worst <= FLOAT32_BOUND, (
        f"d_model={d_model}: worst float32 error {worst:.3e} below 2**20"
    )


def test_float32_d_model_512_windows() -> None:
    """d_model=512 (256 frequencies): every position below 2**14 and in the top windows below 2**20 and 2**24."""
    windows = [(0, 2**14), (2**20 - 2**12, 2**20), (2**24 - 2**12, 2**24)]
    for low, high in windows:
        for start in range(low, high, 2**12):
            positions = np.arange(start, min(start + 2**12, high))
            check(sinusoidal_encoding(torch.from_numpy(positions), 512), positions, 512)


@pytest.mark.parametrize("d_model", [1, 3, 128, 512, 1023, 4096])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_sampled_positions_up_to_2_to_24(d_model: int, dtype: torch.dtype) -> None:
    rng = np.random.default_rng(d_model)
    positions = np.concatenate([rng.integers(0, 2**24, 2000), [0, 1, 2**24 - 1]])
    check(
        sinusoidal_encoding(torch.from_numpy(positions), d_model, dtype=dtype),
        positions,
        d_model,
    )


VARIANTS = [("half", "paper", 10000.0), ("half", "tensor2tensor", 10000.0),
            ("interleaved", "tensor2tensor", 500.0), ("interleaved", "paper", 1e6)]  # fmt: skip


@pytest.mark.parametrize(("layout", "schedule", "base"), VARIANTS)
@pytest.mark.parametrize("d_model", [9, 256])
def test_float32_layouts_schedules_and_bases(
    layout: str, schedule: str, base: float, d_model: int
) -> None:
    rng = np.random.default_rng(1)
    positions = np.concatenate([np.arange(4096), rng.integers(0, 2**24, 2000)])
    got = sinusoidal_encoding(
        torch.from_numpy(positions),
        d_model,
        base=base,
        layout=layout,
        schedule=schedule,
    )
    check(got, positions, d_model, base=base, layout=layout, schedule=schedule)


def test_exact_values_near_2_to_24() -> None:
    """Against the exact value (mpmath, 40 digits): float64 is within 2**-50 * p, float32 within the bound."""
    rng = np.random.default_rng(2)
    positions = [*rng.integers(2**23, 2**24, 12).tolist(), 2**24 - 1, 4974, 35]
    exact = exact_encoding(positions, 512)
    as_float64 = sinusoidal_encoding(
        torch.tensor(positions), 512, dtype=torch.float64
    ).numpy()
    assert (
        np.abs(as_float64 - exact) - 2.0**-50 * np.array(positions)[:, None]
    ).max() <= 0
    assert (
        np.abs(sinusoidal_encoding(torch.tensor(positions), 512).numpy() - exact).max()
        <= FLOAT32_BOUND
    )


# ----------------------------------------------------------------------------------------------------------
# float16 and bfloat16
# ----------------------------------------------------------------------------------------------------------

HALF_CASES = [(64, np.arange(2**16)), (512, np.arange(2**12)), (7, np.arange(2**14)),
              (512, np.random.default_rng(3).integers(0, 2**24, 2000))]  # fmt: skip


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
def test_half_within_one_rounding(dtype: torch.dtype) -> None:
    """Holds now and after the fix: within half a unit of the dtype (+ half a float32 unit)."""
    for d_model, positions in HALF_CASES:
        check(
            sinusoidal_encoding(torch.from_numpy(positions), d_model, dtype=dtype),
            positions,
            d_model,
        )


@pytest.mark.parametrize("dtype", half_params())
def test_half_rounded_once(dtype: torch.dtype) -> None:
    """The goal: the float64 value rounded once, at every position (sweeps and samples up to 2**24)."""
    for d_model, positions in HALF_CASES:
        check(
            sinusoidal_encoding(torch.from_numpy(positions), d_model, dtype=dtype),
            positions,
            d_model,
            once=True,
        )


@pytest.mark.parametrize("dtype", half_params())
def test_half_known_double_rounding_input(dtype: torch.dtype) -> None:
    p, channel, rounded_once = KNOWN_DOUBLE_ROUNDING[dtype]
    assert (
        sinusoidal_encoding(p + 1, 512, dtype=dtype)[p, channel].item() == rounded_once
    )


# ----------------------------------------------------------------------------------------------------------
# The module: cached rows, offsets inside and past the cache, explicit positions
# ----------------------------------------------------------------------------------------------------------

PATHS = [
    "cached",
    "offset_in_cache",
    "offset_past_cache",
    "explicit_1d",
    "explicit_2d",
    "explicit_near_2_24",
]


def module_output(
    path: str, dtype: torch.dtype, batch_first: bool, device: str = "cpu"
) -> tuple[torch.Tensor, np.ndarray]:
    """PositionalEncoding(512) applied to zeros along one code path.

    Returns:
        (the encoding it added, [batch, seq_len, 512]; the positions it used, [batch, seq_len]).
    """
    seq_len, batch, offset, positions, max_len = 300, 2, 0, None, 1024
    if path == "offset_in_cache":
        offset = 20  # rows 20..319 of the cached table
    elif path == "offset_past_cache":
        offset, max_len = 20, 16  # rows past the cache: computed on the fly
    elif path == "explicit_1d":
        positions = torch.arange(300).flip(0) * 3 + 7
        positions[:2] = torch.tensor([35, 45])  # the known double-rounding inputs
    elif path == "explicit_2d":
        positions = torch.stack([torch.arange(300), torch.arange(300) * 97 + 5000])
    elif path == "explicit_near_2_24":
        positions = torch.cat(
            [torch.tensor([35, 45]), 2**24 - 1 - torch.arange(298) * 4099]
        )
    module = PositionalEncoding(512, max_len=max_len, batch_first=batch_first)
    shape = (batch, seq_len, 512) if batch_first else (seq_len, batch, 512)
    x = torch.zeros(shape, dtype=dtype, device=device)
    out = module(
        x, offset=offset, positions=None if positions is None else positions.to(device)
    )
    out = out if batch_first else out.transpose(0, 1)
    if positions is None:
        positions = torch.arange(offset, offset + seq_len)
    return out, np.broadcast_to(positions.numpy(), (batch, seq_len)).copy()


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, *HALF], ids=dtype_id)
def test_module_bounds(dtype: torch.dtype, path: str, batch_first: bool) -> None:
    out, positions = module_output(path, dtype, batch_first)
    assert out.dtype == dtype
    check(out, positions, 512)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", half_params())
def test_module_half_rounded_once(dtype: torch.dtype, path: str) -> None:
    out, positions = module_output(path, dtype, batch_first=False)
    check(out, positions, 512, once=True)


@needs_compile
def test_module_under_torch_compile() -> None:
    """Under torch.compile, rows past the cache are computed inside the graph: same values as eager, same bounds."""
    module = PositionalEncoding(512, max_len=16)
    x = torch.zeros(300, 2, 512, dtype=torch.float16)
    out = torch.compile(module, dynamic=False)(x, offset=20)
    assert torch.equal(out, module(x, offset=20))
    check(
        out.transpose(0, 1), np.broadcast_to(np.arange(20, 320), (2, 300)).copy(), 512
    )


# ----------------------------------------------------------------------------------------------------------
# CUDA: the same bounds on the GPU (run by the GPU job; skipped without CUDA)
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_float32_every_position_below_2_to_20() -> None:
    """d_model=512, every position below 2**20, against float64 angles from NumPy's frequencies (on the GPU)."""
    omega = torch.from_numpy(numpy_omega(512)).cuda()
    worst = 0.0
    for start in range(0, 2**20, 2**14):
        positions = torch.arange(start, start + 2**14, device="cuda")
        angle = positions.double()[:, None] * omega
        reference = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(
            -2
        )
        got = sinusoidal_encoding(positions, 512)
        assert got.device.type == "cuda"
        worst = max(worst, (got.double() - reference).abs().max().item())
    assert worst <= FLOAT32_BOUND, f"CUDA float32 worst error {worst:.3e} below 2**20"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, *HALF], ids=dtype_id)
@pytest.mark.parametrize("d_model", [7, 512])
def test_cuda_sampled_positions_up_to_2_to_24(dtype: torch.dtype, d_model: int) -> None:
    positions = np.concatenate(
        [np.arange(4096), np.random.default_rng(4).integers(0, 2**24, 4000)]
    )
    check(
        sinusoidal_encoding(torch.from_numpy(positions).cuda(), d_model, dtype=dtype),
        positions,
        d_model,
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dtype",
    [pytest.param(dtype, id=dtype_id(dtype)) for dtype in HALF],
)
def test_cuda_half_rounded_once(dtype: torch.dtype) -> None:
    positions = np.arange(2**14)
    check(
        sinusoidal_encoding(torch.from_numpy(positions).cuda(), 512, dtype=dtype),
        positions,
        512,
        once=True,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, *HALF], ids=dtype_id)
def test_cuda_module_bounds(dtype: torch.dtype, path: str) -> None:
    out, positions = module_output(path, dtype, batch_first=True, device="cuda")
    assert out.device.type == "cuda" and out.dtype == dtype
    check(out, positions, 512)


def test_bound_is_two_float32_rounding_steps() -> None:
    """The constants used above: 6e-8 is just over 2**-24, one float32 unit in [0.5, 1), two half-units."""
    assert 2.0**-24 < FLOAT32_BOUND < 2.0**-24 * 1.01
    assert math.isclose(half_ulp(np.array([0.75]), torch.float32)[0], 2.0**-25)
    assert (
        half_ulp(np.array([1e-6]), torch.float16)[0] == 2.0**-25
    )  # float16 subnormal spacing 2**-24


def _classic_table(
    positions: torch.Tensor, d_model: int, dtype: torch.dtype
) -> torch.Tensor:
    """The classic recipe (labml, spotpython) at ``positions`` [n], angles formed in ``dtype``: [n, d_model]."""
    two_i = torch.arange(0, d_model, 2, dtype=dtype)
    div_term = torch.exp(two_i * -(math.log(10000.0) / d_model))
    angle = positions.to(dtype)[:, None] * div_term
    return torch.stack((torch.sin(angle), torch.cos(angle)), dim=-1).flatten(-2)


@pytest.mark.parametrize("d_model", [8, 64, 512])
def test_classic_recipe_within_the_bound_the_book_prints(d_model: int) -> None:
    """book/10_precision.ipynb and 03 print, instead of the machine's float32 errors of the classic recipe, that
    each is within (2 ln(base) + 4) u p + 2u per octave of positions: the bound is asserted here, on this machine's
    kernels (and those CI selects with ATEN_CPU_CAPABILITY)."""
    u = 2.0**-24
    c = 2 * math.log(10000.0) + 4
    for k in range(21):
        positions = torch.arange(2**k, 2 ** (k + 1))[-2048:]
        exact = sinusoidal_encoding(positions, d_model, dtype=torch.float64)
        err = (
            (_classic_table(positions, d_model, torch.float32).double() - exact)
            .abs()
            .max()
            .item()
        )
        assert err <= c * u * 2 ** (k + 1) + 2 * u, (k, err)
    # and it is a real loss: far above posenc's 2^-24 once p is large
    assert err > 1000 * u


@pytest.mark.parametrize(
    ("dtype", "unit"), [(torch.float16, 2.0**-11), (torch.bfloat16, 2.0**-8)]
)
def test_half_precision_angles_within_their_bound(
    dtype: torch.dtype, unit: float
) -> None:
    c = 2 * math.log(10000.0) + 4
    for k in range(17):
        positions = torch.arange(2**k, 2 ** (k + 1))[-1024:]
        exact = sinusoidal_encoding(positions, 512, dtype=torch.float64)
        err = torch.nan_to_num(
            (_classic_table(positions, 512, dtype).double() - exact).abs(), nan=2.0
        ).max()
        assert err.item() <= min(2.0, c * unit * 2 ** (k + 1) + 2 * unit), (
            k,
            err.item(),
        )


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [(torch.float16, (1971, 353, 4304)), (torch.bfloat16, (257, 55, 512))],
    ids=["float16", "bfloat16"],
)
def test_half_precision_angles_off_by_more_than_1_where_the_book_says(
    dtype: torch.dtype, expected: tuple[int, int, int]
) -> None:
    """book/10_precision.ipynb scans every row p < 65,520 of the d_model = 512 classic table, angles formed in
    ``dtype``, for an error above 1: the first such row, how many rows after it stay within 1, and the last of
    those (every later row is above 1). Rows 2,048 (float16) and 256 (bfloat16), where u p = 1, are within 1.
    Each pair's angle depends on that pair alone, so the 16 fastest pairs are scanned first and the rest only
    where those stay within 1. No row's error comes closer to 1 than 5e-4 (measured); the counts are also
    checked under ATEN_CPU_CAPABILITY=default by the portability run of the chapter."""
    p = torch.arange(65_520)
    fast = _classic_table(p, 512, dtype)[:, :32].double()  # the 16 fastest pairs
    angle = p.double()[:, None] * torch.from_numpy(numpy_omega(512)[:16])
    exact_fast = torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(-2)
    above = (fast - exact_fast).abs().amax(1) > 1
    rest = p[~above]
    full = _classic_table(rest, 512, dtype).double()
    exact = sinusoidal_encoding(rest, 512, dtype=torch.float64)
    above[rest] = (full - exact).abs().amax(1) > 1
    first = int(above.nonzero()[0])
    within_after = int((~above[first:]).sum())
    last_within = int((~above).nonzero()[-1])
    assert (first, within_after, last_within) == expected
    at_u_p_1 = 2048 if dtype == torch.float16 else 256
    assert not above[at_u_p_1]
