"""Every bad input to posenc, in one place: ``tests/sinusoidal/test_module_reliability.py`` turns each case into a
test, and ``book/13_reliability.ipynb`` executes them to print the table of what the user gets.

A case is a call that must raise ``error`` with a message that matches ``match`` (a regular expression; it names
the argument) and contains ``given`` (what the user passed). ``classic`` is the same mistake made with the classic
module (spotpython's, the PyTorch tutorial's), where it applies, to show what happens without posenc.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch

from posenc import (
    PositionalEncoding,
    frequencies,
    get_positional_encoding,
    sinusoidal_encoding,
)
from tests.references.classic import SpotpythonPositionalEncoding


@dataclass(frozen=True)
class BadInput:
    """One bad input: the call, the exception it must raise and what its message must say."""

    name: str  # what the user did, as they would write it
    call: Callable[[], object]
    error: type[Exception]
    match: str  # regular expression the message must match: the argument's name
    given: str  # text of the bad value the message must repeat
    classic: Optional[Callable[[], object]] = (
        None  # the same mistake with the classic module
    )


def _x(
    seq_len: int = 3, batch: int = 2, d_model: int = 16, **kwargs: object
) -> torch.Tensor:
    return torch.zeros(seq_len, batch, d_model, **kwargs)


def _pe(**kwargs: object) -> PositionalEncoding:
    return PositionalEncoding(16, **kwargs)


def _classic() -> SpotpythonPositionalEncoding:
    return SpotpythonPositionalEncoding(16, 0.0, max_len=64)


def _seeded() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _load(state: dict[str, object]) -> object:
    return _pe().load_state_dict(state, strict=True)


def _checkpoint_width_32() -> object:
    return _pe().load_state_dict(
        SpotpythonPositionalEncoding(32, 0.0, max_len=64).state_dict(), strict=True
    )


CASES: list[BadInput] = [
    # --- constructing the module
    BadInput(
        "PositionalEncoding(d_model=0)",
        lambda: PositionalEncoding(0),
        ValueError,
        "d_model",
        "0",
    ),
    BadInput(
        "PositionalEncoding(d_model=-8)",
        lambda: PositionalEncoding(-8),
        ValueError,
        "d_model",
        "-8",
    ),
    BadInput(
        "PositionalEncoding(d_model=16.0)",
        lambda: PositionalEncoding(16.0),
        TypeError,
        "d_model",
        "16.0",
    ),
    BadInput(
        "PositionalEncoding(d_model='16')",
        lambda: PositionalEncoding("16"),
        TypeError,
        "d_model",
        "'16'",
    ),
    BadInput(
        "PositionalEncoding(d_model=True)",
        lambda: PositionalEncoding(True),
        TypeError,
        "d_model",
        "True",
    ),
    BadInput(
        "dropout_prob=1.5",
        lambda: _pe(dropout_prob=1.5),
        ValueError,
        "dropout_prob",
        "1.5",
        classic=lambda: SpotpythonPositionalEncoding(16, 1.5),
    ),
    BadInput(
        "dropout_prob=-0.1",
        lambda: _pe(dropout_prob=-0.1),
        ValueError,
        "dropout_prob",
        "-0.1",
    ),
    BadInput(
        "dropout_prob=nan",
        lambda: _pe(dropout_prob=float("nan")),
        ValueError,
        "dropout_prob",
        "nan",
    ),
    BadInput(
        "dropout_prob='0.1'",
        lambda: _pe(dropout_prob="0.1"),
        TypeError,
        "dropout_prob",
        "'0.1'",
    ),
    BadInput(
        "dropout=1.5 (the PyTorch tutorial's keyword)",
        lambda: _pe(dropout=1.5),
        ValueError,
        "^dropout must",
        "1.5",
    ),
    BadInput(
        "dropout_prob=0.1 and dropout=0.1 together",
        lambda: _pe(dropout_prob=0.1, dropout=0.1),
        TypeError,
        "dropout_prob .* or dropout .*not both",
        "dropout=0.1",
    ),
    BadInput("base=1", lambda: _pe(base=1), ValueError, "base", "1"),
    BadInput("base=0.5", lambda: _pe(base=0.5), ValueError, "base", "0.5"),
    BadInput("base=inf", lambda: _pe(base=float("inf")), ValueError, "base", "inf"),
    BadInput("base=nan", lambda: _pe(base=float("nan")), ValueError, "base", "nan"),
    BadInput("base='10000'", lambda: _pe(base="10000"), TypeError, "base", "'10000'"),
    BadInput("max_len=0", lambda: _pe(max_len=0), ValueError, "max_len", "0"),
    BadInput("max_len=2.5", lambda: _pe(max_len=2.5), TypeError, "max_len", "2.5"),
    BadInput(
        "batch_first='yes'",
        lambda: _pe(batch_first="yes"),
        TypeError,
        "batch_first",
        "'yes'",
    ),
    BadInput(
        "layout='sincos'",
        lambda: _pe(layout="sincos"),
        ValueError,
        "layout",
        "'sincos'",
    ),
    BadInput(
        "schedule='t2t'",
        lambda: _pe(schedule="t2t"),
        ValueError,
        "schedule",
        "'t2t'",
    ),
    # --- x, the embeddings
    BadInput(
        "x a list",
        lambda: _pe()([[0.0] * 16]),
        TypeError,
        "x must be a torch.Tensor",
        "list",
    ),
    BadInput(
        "x 2-D [seq_len, d_model]",
        lambda: _pe()(torch.zeros(10, 16)),
        ValueError,
        "x must be 3-D",
        "(10, 16)",
        classic=lambda: _classic()(torch.zeros(10, 16)),
    ),
    BadInput(
        "x 4-D",
        lambda: _pe()(torch.zeros(3, 1, 2, 16)),
        ValueError,
        "x must be 3-D",
        "(3, 1, 2, 16)",
        classic=lambda: _classic()(torch.zeros(3, 1, 2, 16)),
    ),
    BadInput(
        "x's last dim 8 != d_model 16",
        lambda: _pe()(_x(d_model=8)),
        ValueError,
        "d_model=16",
        "(3, 2, 8)",
        classic=lambda: _classic()(_x(d_model=8)),
    ),
    BadInput(
        "x int64 (token ids, not embeddings)",
        lambda: _pe()(_x(dtype=torch.long)),
        TypeError,
        "floating",
        "int64",
        classic=lambda: _classic()(_x(dtype=torch.long)),
    ),
    BadInput(
        "x complex64",
        lambda: _pe()(_x(dtype=torch.complex64)),
        TypeError,
        "floating",
        "complex64",
    ),
    # --- offset
    BadInput("offset=-1", lambda: _pe()(_x(), offset=-1), ValueError, "offset", "-1"),
    BadInput(
        "offset=torch.tensor(-1)",
        lambda: _pe()(_x(), offset=torch.tensor(-1)),
        ValueError,
        "offset",
        "-1",
    ),
    BadInput("offset=1.5", lambda: _pe()(_x(), offset=1.5), TypeError, "offset", "1.5"),
    BadInput("offset='3'", lambda: _pe()(_x(), offset="3"), TypeError, "offset", "'3'"),
    BadInput(
        "offset=True", lambda: _pe()(_x(), offset=True), TypeError, "offset", "True"
    ),
    BadInput(
        "offset=2**63 - 1",
        lambda: _pe()(_x(), offset=2**63 - 1),
        ValueError,
        "offset",
        "9223372036854775807",
    ),
    # --- positions
    BadInput(
        "positions float",
        lambda: _pe()(_x(), positions=torch.tensor([0.0, 1.0, 2.0])),
        TypeError,
        "positions",
        "float32",
    ),
    BadInput(
        "positions bool",
        lambda: _pe()(_x(), positions=torch.tensor([True, False, True])),
        TypeError,
        "positions",
        "bool",
    ),
    BadInput(
        "positions a list",
        lambda: _pe()(_x(), positions=[0, 1, 2]),
        TypeError,
        "positions",
        "list",
    ),
    BadInput(
        "positions and offset=2 together",
        lambda: _pe()(_x(), positions=torch.arange(3), offset=2),
        ValueError,
        "offset or positions",
        "offset=2",
    ),
    BadInput(
        "positions negative",
        lambda: _pe()(_x(), positions=torch.tensor([-1, 0, 1])),
        ValueError,
        "positions",
        "-1",
    ),
    BadInput(
        "positions [seq_len + 1]",
        lambda: _pe()(_x(), positions=torch.arange(4)),
        ValueError,
        "positions",
        "(4,)",
    ),
    BadInput(
        "positions [seq_len, batch] (transposed)",
        lambda: _pe()(_x(), positions=torch.zeros(3, 2, dtype=torch.long)),
        ValueError,
        "positions",
        "(3, 2)",
    ),
    BadInput(
        "positions [batch + 1, seq_len]",
        lambda: _pe()(_x(), positions=torch.zeros(3, 3, dtype=torch.long)),
        ValueError,
        "positions",
        "(3, 3)",
    ),
    BadInput(
        "positions 3-D",
        lambda: _pe()(_x(), positions=torch.zeros(1, 2, 3, dtype=torch.long)),
        ValueError,
        "positions",
        "(1, 2, 3)",
    ),
    # --- the functions
    BadInput(
        "sinusoidal_encoding(-1, 16)",
        lambda: sinusoidal_encoding(-1, 16),
        ValueError,
        "positions",
        "-1",
    ),
    BadInput(
        "sinusoidal_encoding(2.5, 16)",
        lambda: sinusoidal_encoding(2.5, 16),
        TypeError,
        "positions",
        "float",
    ),
    BadInput(
        "sinusoidal_encoding(4, 16, dtype=torch.int64)",
        lambda: sinusoidal_encoding(4, 16, dtype=torch.int64),
        TypeError,
        "dtype",
        "torch.int64",
    ),
    BadInput(
        "frequencies(16, schedule='t2t')",
        lambda: frequencies(16, schedule="t2t"),
        ValueError,
        "schedule",
        "'t2t'",
    ),
    BadInput(
        "get_positional_encoding(16, max_len=0)",
        lambda: get_positional_encoding(16, 0),
        ValueError,
        "max_len",
        "0",
    ),
    # --- settings
    BadInput(
        "module.max_len = 10 after construction",
        lambda: setattr(_pe(), "max_len", 10),
        AttributeError,
        "max_len is fixed",
        "max_len=10",
    ),
    # --- checkpoints
    BadInput(
        "classic checkpoint of width 32 into d_model=16",
        _checkpoint_width_32,
        RuntimeError,
        "d_model=16",
        "32",
    ),
    BadInput(
        "checkpoint with a learned table 'pe'",
        lambda: _load(
            {"pe": torch.nn.Parameter(torch.randn(64, 1, 16, generator=_seeded()))}
        ),
        RuntimeError,
        "pe: the checkpoint's table is not this module's",
        "differs by",
    ),
    BadInput(
        "checkpoint table in the half layout",
        lambda: _load({"pe": sinusoidal_encoding(64, 16, layout="half")}),
        RuntimeError,
        "pe: .*layout='half'",
        "half",
    ),
    BadInput(
        "checkpoint 'pe' a 0-d tensor",
        lambda: _load({"pe": torch.tensor(1.0)}),
        RuntimeError,
        "pe: expected a positional table",
        "shape ()",
    ),
    BadInput(
        "checkpoint 'pe' a list",
        lambda: _load({"pe": [0.0] * 16}),
        RuntimeError,
        "pe: expected a positional table",
        "list",
    ),
]


def outcome(call: Callable[[], object]) -> str:
    """What a call does, in one line: the exception type and message, or the shape and dtype it returns."""
    try:
        result = call()
    except Exception as error:  # reporting whatever the user would see
        return f"{type(error).__name__}: {error}"
    if isinstance(result, torch.Tensor):
        return f"returns shape {tuple(result.shape)}, {str(result.dtype).removeprefix('torch.')}"
    return f"returns {type(result).__name__}"
