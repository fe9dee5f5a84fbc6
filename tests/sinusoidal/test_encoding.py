"""posenc.frequencies and posenc.sinusoidal_encoding: values against an independent NumPy float64 evaluation,
shapes, dtypes, odd widths, argument errors, and docstrings that read as plain text in ``help()``."""

from __future__ import annotations

import inspect
import math
import re

import numpy as np
import pytest
import torch

import posenc
from posenc import frequencies, sinusoidal_encoding
from posenc.sinusoidal import encoding
from tests.references.exact import numpy_encoding
from tests.references.exact import round_once as single_rounding


@pytest.mark.parametrize("d_model", [1, 2, 3, 7, 64, 512, 513])
@pytest.mark.parametrize("base", [10.0, 10000.0, 1e6])
def test_matches_numpy_float64(d_model: int, base: float) -> None:
    positions = np.arange(2000)
    ours = sinusoidal_encoding(2000, d_model, base=base, dtype=torch.float64).numpy()
    # Both evaluate the same float64 formula; they differ only in how w_i is rounded (pow vs exp/log), an
    # error of a few ulps of w_i, i.e. ~p * 4e-16 <= 1e-12 in the angle for p < 2000.
    np.testing.assert_allclose(
        ours, numpy_encoding(positions, d_model, base=base), rtol=0, atol=1e-12
    )


def test_frequencies_values_and_shape() -> None:
    omega = frequencies(512)
    assert omega.shape == (256,) and omega.dtype == torch.float64
    expected = torch.tensor(
        [10000.0 ** (-2 * i / 512) for i in range(256)], dtype=torch.float64
    )
    torch.testing.assert_close(omega, expected, rtol=1e-15, atol=0)
    assert frequencies(7).shape == (4,), "ceil(d/2) frequencies for odd d_model"
    assert frequencies(8, dtype=torch.float32).dtype == torch.float32
    # wavelengths in geometric progression from 2 pi towards 2 pi base
    wavelengths = 2 * math.pi / frequencies(64, base=100.0)
    ratios = wavelengths[1:] / wavelengths[:-1]
    torch.testing.assert_close(ratios, torch.full_like(ratios, 100.0 ** (2 / 64)))
    assert wavelengths[0] == pytest.approx(2 * math.pi)


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64]
)
def test_dtype_is_the_float64_value_rounded_once(dtype: torch.dtype) -> None:
    exact = sinusoidal_encoding(3000, 64, dtype=torch.float64)
    # Not exact.to(dtype): torch converts float64 to float16/bfloat16 through float32, rounding twice.
    expected = torch.from_numpy(single_rounding(exact.numpy(), dtype)).to(dtype)
    assert torch.equal(sinusoidal_encoding(3000, 64, dtype=dtype), expected)


def test_shapes_of_positions() -> None:
    assert sinusoidal_encoding(0, 8).shape == (0, 8)
    assert sinusoidal_encoding(5, 8).shape == (5, 8)
    assert sinusoidal_encoding(torch.tensor(3), 8).shape == (8,)
    grid = torch.tensor([[0, 1, 2], [7, 8, 9]])
    out = sinusoidal_encoding(grid, 8)
    assert out.shape == (2, 3, 8)
    assert torch.equal(out[1, 2], sinusoidal_encoding(10, 8)[9])
    for dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        assert torch.equal(
            sinusoidal_encoding(torch.arange(5, dtype=dtype), 8),
            sinusoidal_encoding(5, 8),
        )
    assert torch.equal(sinusoidal_encoding(np.int64(4), 8), sinusoidal_encoding(4, 8))


def test_odd_d_model_last_channel_is_an_unpaired_sine() -> None:
    odd = sinusoidal_encoding(100, 7, dtype=torch.float64)
    even = sinusoidal_encoding(100, 8, dtype=torch.float64)
    p = torch.arange(100, dtype=torch.float64)
    torch.testing.assert_close(
        odd[:, 6], torch.sin(p * 10000.0 ** (-6 / 7)), rtol=0, atol=1e-13
    )
    # the paired channels of an odd width use base^(-2i/7), not base^(-2i/8)
    assert not torch.allclose(odd[:, 2], even[:, 2])


def test_bounded_and_values_at_position_zero() -> None:
    table = sinusoidal_encoding(10_000, 128)
    assert table.abs().max() <= 1
    assert torch.equal(table[0, 0::2], torch.zeros(64)) and torch.equal(
        table[0, 1::2], torch.ones(64)
    )


def test_large_positions_stay_exact_in_float32() -> None:
    positions = torch.tensor([2**20, 2**23 + 12345, 2**24 - 1])
    exact = numpy_encoding(positions.numpy(), 256)
    ours = sinusoidal_encoding(positions, 256, dtype=torch.float32).double().numpy()
    # float32 rounding of a value in [-1, 1] is at most 2^-25 ~ 3e-8; the float64 angle adds < 4e-9 at p < 2^24
    assert np.abs(ours - exact).max() <= 6e-8


def test_device_argument() -> None:
    assert sinusoidal_encoding(4, 8, device="cpu").device.type == "cpu"
    assert (
        sinusoidal_encoding(torch.arange(4), 8, device=torch.device("cpu")).device.type
        == "cpu"
    )
    meta = sinusoidal_encoding(torch.arange(4, device="meta"), 8)
    assert meta.device.type == "meta" and meta.shape == (4, 8)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (
            lambda: sinusoidal_encoding(4, 0),
            ValueError,
            ["d_model", "0", "d_model=512"],
        ),
        (lambda: sinusoidal_encoding(4, -3), ValueError, ["d_model", "-3"]),
        (lambda: sinusoidal_encoding(4, 8.0), TypeError, ["d_model", "8.0", "float"]),
        (lambda: sinusoidal_encoding(4, True), TypeError, ["d_model", "True"]),
        (
            lambda: sinusoidal_encoding(4, 8, base=1.0),
            ValueError,
            ["base", "1.0", "10000"],
        ),
        (lambda: sinusoidal_encoding(4, 8, base=0.5), ValueError, ["base", "0.5"]),
        (
            lambda: sinusoidal_encoding(4, 8, base=float("inf")),
            ValueError,
            ["base", "inf"],
        ),
        (lambda: sinusoidal_encoding(4, 8, base="1e4"), TypeError, ["base", "'1e4'"]),
        (
            lambda: sinusoidal_encoding(4, 8, dtype=torch.int64),
            TypeError,
            ["dtype", "torch.int64"],
        ),
        (lambda: sinusoidal_encoding(-1, 8), ValueError, ["positions", "-1"]),
        (lambda: sinusoidal_encoding(4.0, 8), TypeError, ["positions", "float"]),
        (
            lambda: sinusoidal_encoding(torch.tensor([0.0, 1.0]), 8),
            TypeError,
            ["positions", "torch.float32", "integer positions are required"],
        ),
        (
            lambda: sinusoidal_encoding(torch.tensor([True]), 8),
            TypeError,
            ["positions", "torch.bool"],
        ),
        (
            lambda: sinusoidal_encoding(torch.tensor([3, -2]), 8),
            ValueError,
            ["positions", "-2"],
        ),
        (
            lambda: sinusoidal_encoding(4, 8, layout="sincos"),
            ValueError,
            ["layout", "'sincos'", "'half'"],
        ),
        (
            lambda: sinusoidal_encoding(4, 8, schedule="t2t"),
            ValueError,
            ["schedule", "'t2t'", "'tensor2tensor'"],
        ),
        (lambda: frequencies(8, schedule="x"), ValueError, ["schedule", "'x'"]),
        (lambda: frequencies(0), ValueError, ["d_model", "0"]),
    ],
)
def test_bad_arguments_name_the_argument_value_and_fix(call, error, words) -> None:
    with pytest.raises(error) as info:
        call()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_fractional_positions_are_refused_pointing_to_timestep_embedding() -> None:
    # positions.long() would turn 0.5 into 0 without a word: the message must not advise it, and must name the
    # function that takes continuous positions as they are, in a call that runs
    positions = torch.tensor([0.5, 999.0])
    with pytest.raises(TypeError) as info:
        sinusoidal_encoding(positions, 64)
    message = str(info.value)
    for words in ("positions", "torch.float32", "integer positions are required"):
        assert words in message, message
    assert ".long()" not in message, message
    call = re.search(r"posenc\.timestep_embedding\(t, (\d+)\)", message)
    assert call, message
    assert posenc.timestep_embedding(positions, int(call.group(1))).shape == (2, 64)


ENCODING_FUNCTIONS = sorted(
    name
    for name, value in vars(encoding).items()
    if inspect.isfunction(value) and value.__module__ == encoding.__name__
)


@pytest.mark.parametrize("name", ["<module>", *ENCODING_FUNCTIONS])
def test_docstrings_read_as_plain_text(name: str) -> None:
    """No ``$...$`` math and no LaTeX command: ``help()`` shows docstrings as they are written (issue 20)."""
    doc = inspect.getdoc(encoding if name == "<module>" else getattr(encoding, name))
    assert doc, f"{name} has no docstring"
    assert "$" not in doc, (name, doc)
    assert not re.search(r"\\[A-Za-z]+", doc), (name, re.findall(r"\\[A-Za-z]+", doc))
