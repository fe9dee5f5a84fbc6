"""posenc/_checks.py (book/18_argument_checks.ipynb): the argument checks every module shares, and the decision of
where values may be read; and tests/references/host_syncs.py, the harness that finds host
synchronisations without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from posenc._checks import (
    MAX_POSITION,
    check_base,
    check_bool,
    check_choice,
    check_count,
    check_dtype,
    check_even,
    check_int,
    check_offset,
    check_real,
    values_checkable,
)
from tests.references.floors import needs_fake_accelerator
from tests.references.host_syncs import DEVICE, host_syncs


@pytest.mark.parametrize("value", [3, np.int64(3), torch.tensor(3)])
def test_check_int_takes_python_numpy_and_0d_tensor_ints(value: object) -> None:
    assert check_int("n", value, "fix") == 3


@pytest.mark.parametrize("value", [True, 3.0, "3", None, torch.tensor([1.0])])
def test_check_int_refuses_the_rest_naming_the_argument(value: object) -> None:
    with pytest.raises(TypeError, match=r"^n must be an int, got .*; pass n=3$"):
        check_int("n", value, "pass n=3")


def test_check_count_bounds_below_and_names_value_and_fix() -> None:
    assert check_count("d_model", 1, 1, "512") == 1
    with pytest.raises(
        ValueError,
        match=r"d_model must be a positive int \(width\), got 0; pass e\.g\. d_model=512",
    ):
        check_count("d_model", 0, 1, "512", "width")
    with pytest.raises(ValueError, match=r"dim must be an int >= 2, got 1"):
        check_count("dim", 1, 2, "256")
    with pytest.raises(
        TypeError, match=r"dim must be an int >= 2, got 2\.0 of type float"
    ):
        check_count("dim", 2.0, 2, "256")
    with pytest.raises(TypeError, match="got True of type bool"):
        check_count("dim", True, 1, "256")


@pytest.mark.parametrize("value", [0, -2, 3, 63])
def test_check_even_refuses_odd_and_non_positive(value: int) -> None:
    with pytest.raises(
        ValueError, match=f"head_dim must be a positive even int .*got {value}"
    ):
        check_even("head_dim", value, "channels per head", "128")
    assert check_even("head_dim", 64, "channels per head", "128") == 64


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), -float("inf"), 0.0, -1.0]
)
def test_check_real_refuses_non_finite_and_out_of_bounds(value: float) -> None:
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0 \(why\)"):
        check_real("scale", value, above=0.0, why="why", example="1.0")


def test_check_real_upper_bound_types_and_conversion() -> None:
    assert check_real("p", 1, above=0.0, at_most=1.0, why="w", example="0.5") == 1.0
    assert isinstance(check_real("p", np.float32(0.5), why="w", example="0.5"), float)
    with pytest.raises(
        ValueError, match=r"p must be a finite number > 0 and <= 1 \(w\), got 1\.5"
    ):
        check_real("p", 1.5, above=0.0, at_most=1.0, why="w", example="0.5")
    with pytest.raises(TypeError, match="p must be a real number"):
        check_real("p", True, why="w", example="0.5")
    with pytest.raises(TypeError, match="p must be a real number"):
        check_real("p", "0.5", why="w", example="0.5")


def test_check_real_passes_symbolic_floats_under_compile() -> None:
    # with dynamic shapes a float derived from a size is symbolic: math.isfinite cannot read it
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * check_real("s", x.shape[0] / 2, above=0.0, why="w", example="1")

    compiled = torch.compile(f, dynamic=True, fullgraph=True, backend="eager")
    x = torch.ones(6)
    assert torch.equal(compiled(x), x * 3)


def test_check_base_choice_bool_dtype() -> None:
    assert check_base(10000) == 10000.0
    with pytest.raises(
        ValueError, match=r"base must be a finite number > 1 .*got 1\.0"
    ):
        check_base(1.0)
    with pytest.raises(ValueError, match=r"layout must be one of 'a', 'b', got 'c'"):
        check_choice("layout", "c", ("a", "b"))
    with pytest.raises(
        ValueError, match=r"got \['a'\]"
    ):  # unhashable, still a clear error
        check_choice("layout", ["a"], ("a", "b"))
    with pytest.raises(TypeError, match=r"flip must be a bool \(why\), got 'yes'"):
        check_bool("flip", "yes", "why")
    assert check_dtype(torch.bfloat16) is torch.bfloat16
    with pytest.raises(
        TypeError, match=r"dtype must be a floating torch\.dtype, got torch\.int64"
    ):
        check_dtype(torch.int64)


def test_check_offset_range_and_types() -> None:
    assert check_offset(0) == 0 and check_offset(MAX_POSITION) == MAX_POSITION
    assert check_offset(torch.tensor(5)) == 5
    with pytest.raises(ValueError, match=r"offset must be an int >= 0 .*got -1$"):
        check_offset(-1)
    for bad in (MAX_POSITION + 1, 2**63 - 1):
        with pytest.raises(ValueError, match=rf"must be at most 2\*\*53 .*got {bad}; "):
            check_offset(bad)
    for bad in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="offset must be an int >= 0"):
            check_offset(bad)
    with pytest.raises(ValueError, match="positions must be"):
        check_offset(-3, "positions")


def test_check_offset_raises_on_a_negative_offset_under_compile() -> None:
    def f(x: torch.Tensor, offset: int) -> torch.Tensor:
        return x + check_offset(offset)

    compiled = torch.compile(f, dynamic=True, fullgraph=True, backend="eager")
    x = torch.zeros(2)
    assert torch.equal(compiled(x, 3), x + 3) and torch.equal(compiled(x, 4), x + 4)
    with pytest.raises(Exception, match="offset must be an int >= 0"):
        compiled(x, -10)


def test_values_are_read_on_the_cpu_only() -> None:
    assert values_checkable(torch.arange(3))
    assert not values_checkable(torch.empty(3, device="meta"))
    with FakeTensorMode():
        assert not values_checkable(torch.empty(3))  # fake, on the CPU: no values
        assert not values_checkable(torch.empty(3, device="cuda"))


def test_values_are_not_read_inside_torch_func_or_a_compiled_graph() -> None:
    inside = torch.func.vmap(lambda t: torch.tensor(values_checkable(t)))(
        torch.arange(4)
    )
    assert not inside.any()
    compiled = torch.compile(
        lambda t: t + (1 if values_checkable(t) else 2), fullgraph=True, backend="eager"
    )
    assert torch.equal(compiled(torch.zeros(2)), torch.full((2,), 2.0))


@needs_fake_accelerator
def test_the_host_sync_harness_sees_reads_and_copies_and_nothing_else() -> None:
    make = lambda: torch.arange(8, device=DEVICE)  # noqa: E731
    assert host_syncs(lambda t: t * 2 + t.sum(), make) == []
    assert host_syncs(lambda t: t.sum().item(), make) == [
        "aten._local_scalar_dense.default"
    ]
    assert host_syncs(lambda t: bool(t.min() >= 0), make) == [
        "aten._local_scalar_dense.default"
    ]
    assert host_syncs(lambda t: t.cpu(), make) == ["aten._to_copy.default to the host"]
    assert host_syncs(lambda t: torch.nonzero(t), make) == ["aten.nonzero.default"]


STORAGE_ONLY_NAMES = ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")


@pytest.mark.parametrize(
    "dtype",
    [getattr(torch, n) for n in STORAGE_ONLY_NAMES if hasattr(torch, n)],
    ids=str,
)
def test_dtypes_torch_cannot_compute_with_get_a_type_error_naming_the_argument(
    dtype: torch.dtype,
) -> None:
    # each entry point that takes positions or embeddings, before its first kernel
    # (which would raise NotImplementedError, naming no argument)
    import transformers

    import posenc

    config = transformers.LlamaConfig(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=2
    )
    q = torch.randn(1, 2, 4, 8)
    if dtype.is_floating_point:
        calls = {
            "x": lambda: posenc.PositionalEncoding(8)(
                torch.zeros(4, 1, 8, dtype=dtype)
            ),
            "q": lambda: posenc.RotaryEmbedding(8)(q.to(dtype), q),
            "x ": lambda: posenc.HFRotaryEmbedding(config)(
                torch.zeros(1, 4, 16, dtype=dtype), torch.arange(4)[None]
            ),
        }
    else:
        pos = torch.arange(4).to(dtype)
        calls = {
            "positions": lambda: posenc.PositionalEncoding(8)(
                torch.zeros(4, 1, 8), positions=pos
            ),
            "positions ": lambda: posenc.sinusoidal_encoding(pos, 8),
            "positions  ": lambda: posenc.RotaryEmbedding(8)(q, q, positions=pos),
            "position_ids": lambda: posenc.HFRotaryEmbedding(config)(
                torch.zeros(1, 4, 16), pos[None]
            ),
        }
    for name, call in calls.items():
        fix = ".float()" if dtype.is_floating_point else ".long()"
        with pytest.raises(TypeError, match=rf"{name.strip()}.*{dtype}.*{fix}"):
            call()
    # the computable neighbours still work
    posenc.sinusoidal_encoding(torch.arange(4).to(torch.uint8), 8)
    posenc.PositionalEncoding(8)(torch.zeros(4, 1, 8, dtype=torch.bfloat16))
