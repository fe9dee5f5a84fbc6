"""posenc/_cells.py: a class written over several notebook cells, one part per cell (``method_of``)."""

from __future__ import annotations

import inspect
import pickle

import torch

import posenc
from posenc._cells import method_of


class _Plain:
    def __init__(self, value: int) -> None:
        self.value = value


@method_of(_Plain)
def doubled(self: _Plain) -> int:
    """Twice the value."""
    return 2 * self.value


@method_of(_Plain)
@property
def negated(self: _Plain) -> int:
    return -self.value


def test_a_function_becomes_a_method_under_its_own_name() -> None:
    assert _Plain(3).doubled() == 6
    assert _Plain.doubled.__qualname__ == "_Plain.doubled"
    assert inspect.getdoc(_Plain.doubled) == "Twice the value."


def test_a_property_becomes_one_too() -> None:
    assert _Plain(3).negated == -3
    assert _Plain.negated.fget.__qualname__ == "_Plain.negated"


def test_posencs_classes_hold_their_methods_as_if_written_in_the_class() -> None:
    # the public methods of the two classes written over several cells, as the API page and tracebacks name them
    for cls, names in (
        (posenc.PositionalEncoding, ("forward", "encoding", "extra_repr")),
        (posenc.RotaryEmbedding, ("forward", "rotate", "cos_sin", "extra_repr")),
    ):
        for name in names:
            method = vars(cls)[name]
            assert method.__qualname__ == f"{cls.__name__}.{name}", (cls, name)
    assert isinstance(vars(posenc.RotaryEmbedding)["frequencies"], property)


def test_the_generated_modules_export_no_method_as_a_module_name() -> None:
    import posenc.rotary.rotation as rotation
    import posenc.sinusoidal.module as module

    assert "forward" not in module.__all__ and "forward" not in rotation.__all__


def test_the_modules_pickle_and_run_after_loading() -> None:
    rope, pe = posenc.RotaryEmbedding(8), posenc.PositionalEncoding(8)
    q, x = torch.randn(1, 2, 5, 8), torch.randn(5, 1, 8)
    rope(q, q), pe(x)
    rope2, pe2 = pickle.loads(pickle.dumps((rope, pe)))
    assert rope2._tables == {} and pe2._tables == {}  # TableCache: no table in a pickle
    assert all(torch.equal(a, b) for a, b in zip(rope2(q, q), rope(q, q)))
    assert torch.equal(pe2(x), pe(x))
