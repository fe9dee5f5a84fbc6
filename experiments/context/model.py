r"""A tiny byte-level language model whose rotary embedding is set from a transformers config.

Byte embedding, ``n_layers`` pre-LN blocks of causal self-attention and an MLP, a final LayerNorm and a read-out
tied to nothing. Queries and keys of every head are turned by one :class:`posenc.RotaryEmbedding`, built by
``RotaryEmbedding.from_hf_config`` from a ``transformers.LlamaConfig`` whose ``rope_parameters`` name the
scaling (:func:`llama_config`, :func:`rotary`): the same dict a Llama checkpoint's ``config.json`` carries, and
the layout (``"half"``, Llama's ``rotate_half``) that such a checkpoint uses. Swapping ``model.rope`` changes
the positions' frequencies and nothing else; the weights stay.

The methods (``METHODS``), each to run at ``factor`` times the trained context ``L``:

- ``"none"``: plain RoPE, positions past ``L`` extrapolated;
- ``"linear"``: position interpolation (Chen et al., 2023), every ω_i / factor;
- ``"dynamic"``: dynamic NTK-aware scaling (bloc97), the base raised for each sequence longer than ``L``;
- ``"yarn"``: YaRN (Peng et al., 2023) with transformers' defaults (β_fast = 32, β_slow = 1) and its
  attention factor 0.1 ln(factor) + 1;
- ``"llama3"``: Llama 3.1's wavelength bands (low_freq_factor 1, high_freq_factor 4, as Llama 3.1 ships).

The configs carry what a real checkpoint's would: ``max_position_embeddings`` is the target ``factor * L``
with ``original_max_position_embeddings = L`` for yarn and llama3 (Llama 3.1's shape), while dynamic NTK reads
``max_position_embeddings`` as the length it was trained at, so its config keeps ``L`` there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .data import VOCAB_SIZE

METHODS = ("none", "linear", "dynamic", "yarn", "llama3")
BASE = 10000.0


@dataclass(frozen=True)
class ModelConfig:
    """The architecture."""

    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256
    vocab_size: int = VOCAB_SIZE

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def rope_parameters(method: str, context: int, factor: float) -> dict[str, Any]:
    """The ``rope_parameters`` of ``method`` for a model trained at ``context`` run at
    ``factor * context`` (``"none"``: the default rotation)."""
    common = {"rope_theta": BASE}
    if method == "none":
        return {"rope_type": "default", **common}
    if method in ("linear", "dynamic"):
        return {"rope_type": method, "factor": float(factor), **common}
    if method == "yarn":
        return {
            "rope_type": "yarn",
            "factor": float(factor),
            "original_max_position_embeddings": context,
            **common,
        }
    if method == "llama3":
        return {
            "rope_type": "llama3",
            "factor": float(factor),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": context,
            **common,
        }
    raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


def llama_config(config: ModelConfig, method: str, context: int, factor: float) -> Any:
    """A ``transformers.LlamaConfig`` of this model's shape carrying ``method``'s
    ``rope_parameters`` (see the module docstring for ``max_position_embeddings``)."""
    import transformers

    longest = context if method in ("none", "dynamic") else int(factor * context)
    return transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_heads,
        max_position_embeddings=longest,
        rope_parameters=rope_parameters(method, context, factor),
    )


def rotary(
    config: ModelConfig, method: str, context: int, factor: float, max_len: int
) -> nn.Module:
    """posenc's rotary embedding for ``method``, read from its transformers config."""
    from posenc import RotaryEmbedding

    hf = llama_config(config, method, context, factor)
    return RotaryEmbedding.from_hf_config(hf, max_len=max_len)


class Block(nn.Module):
    """Pre-LN: x + attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, self.heads = config.d_model, config.n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(
            nn.Linear(d, config.d_ff), nn.GELU(), nn.Linear(config.d_ff, d)
        )

    def forward(self, x: Tensor, rope: nn.Module, mask: Tensor) -> Tensor:
        """``x``: ``[batch, seq_len, d_model]``; ``mask``: ``[seq_len, seq_len]`` bool, True
        where a query may not see a key."""
        b, n, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [b, heads, n, hd]
        q, k = rope(q, k)
        # scores[b, h, i, j] = <q_i, k_j> / sqrt(hd), causal
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        weights = scores.masked_fill(mask, float("-inf")).softmax(-1)
        y = (weights @ v).transpose(1, 2).reshape(b, n, d)
        x = x + self.out(y)
        return x + self.mlp(self.ln2(x))


class ByteLM(nn.Module):
    """Next-byte prediction. ``rope`` is a module attribute, swapped to change the scaling."""

    def __init__(self, config: ModelConfig, rope: nn.Module) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)
        self.rope = rope

    def forward(self, tokens: Tensor) -> Tensor:
        """``tokens``: ``[batch, seq_len]`` bytes; returns logits ``[batch, seq_len, 256]``."""
        n = tokens.shape[1]
        mask = torch.ones(n, n, dtype=torch.bool, device=tokens.device).triu(1)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.rope, mask)
        return self.head(self.ln(x))
