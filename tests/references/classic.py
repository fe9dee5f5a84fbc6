"""The classic implementations, restated for comparison (tests, benchmarks and chapters import them from here).

- labml_nn, ``labml_nn/transformers/positional_encoding.py``: ``get_positional_encoding`` and
  ``PositionalEncoding(d_model, dropout_prob, max_len=5000)``, table in a non-persistent buffer
  ``positional_encodings`` (so ``state_dict()`` is empty; labml's ``EmbeddingsWithPositionalEncoding`` in
  ``labml_nn/transformers/models.py`` saves a buffer of that name).
- the PyTorch tutorial "Language Modeling with nn.Transformer" (``beginner_source/transformer_tutorial.py``):
  ``PositionalEncoding(d_model, dropout=0.1, max_len=5000)``, table in a persistent buffer ``pe``.
- spotpython, ``spotpython/light/transformer/positionalEncoding.py``: the tutorial's module with ``dropout`` named
  ``dropout_prob`` and ``max_len=12552`` by default.

labml computes the angles in float32, the tutorial and spotpython in torch's default dtype (float32 by default);
all expect x as ``[seq_len, batch, d_model]`` with even ``d_model``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def labml_get_positional_encoding(d_model: int, max_len: int = 5000) -> Tensor:
    """labml's table: ``[max_len, 1, d_model]``, float32."""
    encodings = torch.zeros(max_len, d_model)
    position = torch.arange(0, max_len, dtype=torch.float32).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    div_term = torch.exp(two_i * -(math.log(10000.0) / d_model))
    encodings[:, 0::2] = torch.sin(position * div_term)
    encodings[:, 1::2] = torch.cos(position * div_term)
    return encodings.unsqueeze(1).requires_grad_(False)


class LabmlPositionalEncoding(nn.Module):
    """labml's module. x: ``[seq_len, batch, d_model]``."""

    def __init__(self, d_model: int, dropout_prob: float, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout_prob)
        self.register_buffer(
            "positional_encodings",
            labml_get_positional_encoding(d_model, max_len),
            False,
        )

    def forward(self, x: Tensor) -> Tensor:
        pe = self.positional_encodings[: x.shape[0]].detach().requires_grad_(False)
        x = x + pe
        x = self.dropout(x)
        return x


class TutorialPositionalEncoding(nn.Module):
    """The PyTorch tutorial's module. x: ``[seq_len, batch, d_model]``."""

    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(
            torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model)
        )
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.pe[: x.size(0)]
        return self.dropout(x)


class SpotpythonPositionalEncoding(TutorialPositionalEncoding):
    """spotpython's module: the tutorial's, with ``dropout`` named ``dropout_prob`` and a longer default table.
    x: ``[seq_len, batch, d_model]``."""

    def __init__(self, d_model: int, dropout_prob: float, max_len: int = 12552) -> None:
        super().__init__(d_model, dropout_prob, max_len)
