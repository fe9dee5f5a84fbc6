r"""A tiny decoder-only transformer whose positional scheme is one argument.

Token embedding, ``n_layers`` pre-LN blocks of causal self-attention and an MLP, a final LayerNorm and a
linear read-out. The attention is written out (not ``nn.MultiheadAttention``) so that rotary and ALiBi can act
on the scores and the attention weights can be returned. The schemes (``SCHEMES``):

- ``"none"`` (NoPE): no positional information; only the causal mask breaks the symmetry between positions.
- ``"learned"``: a learned absolute table of ``max_positions`` vectors added to the embeddings. It has no row
  for a position at or past ``max_positions``, so a longer sequence raises :class:`PositionOutOfRange`.
- ``"sinusoidal"``: ``posenc.PositionalEncoding`` added to the embeddings, positions 0, 1, 2, ...
- ``"sinusoidal_random"``: the same encoding at randomized positions (Ruoss et al., 2023): the positions of a
  sequence of n tokens are a sorted, uniformly random n-subset of ``[0, random_range)``, drawn afresh for every
  sequence (:func:`random_positions`), at training and at evaluation.
- ``"rotary"``: ``posenc.RotaryEmbedding`` rotates the queries and keys of every head (Su et al.).
- ``"alibi"``: a linear bias $-m_h\,(i - j)$ on the score of query $i$ and key $j \le i$, slopes
  $m_h = 2^{-8h/H}$ for heads $h = 1..H$ (Press et al., 2022); nothing is added to the embeddings.

No $\sqrt{d}$ scaling of the embeddings: they are initialised $\mathcal N(0, 1)$, so a token vector has norm
about $\sqrt d$, the same order as $\|PE[p]\| = \sqrt{d/2}$ (the 2017 paper multiplies its embeddings by
$\sqrt d$ and gives no reason for it). The learned
table is initialised $\mathcal N(0, 1/2)$, so that its rows have the norm of the sinusoidal ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from posenc import PositionalEncoding, RotaryEmbedding

from .tasks import VOCAB_SIZE

SCHEMES = ("none", "learned", "sinusoidal", "sinusoidal_random", "rotary", "alibi")


class PositionOutOfRange(ValueError):
    """A position the scheme has no encoding for (the learned table's end)."""


@dataclass(frozen=True)
class ModelConfig:
    """The architecture. ``max_positions`` sizes the learned table (only used by ``"learned"``);
    ``random_range`` is the range ``[0, random_range)`` of the randomized positions."""

    scheme: str
    vocab_size: int = VOCAB_SIZE
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256
    max_positions: int = 42
    random_range: int = 256

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(
                f"scheme must be one of {', '.join(map(repr, SCHEMES))}, got {self.scheme!r}"
            )
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"d_model={self.d_model} must split into n_heads={self.n_heads} heads of even width "
                "(rotary turns pairs of channels); pass e.g. d_model=64, n_heads=4"
            )


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's head slopes $m_h = 2^{-8h/H}$, $h = 1..H$: float32 ``[n_heads]``, from 1/2^(8/H) down to 1/256."""
    h = torch.arange(1, n_heads + 1, dtype=torch.float64)
    return torch.pow(2.0, -8.0 * h / n_heads).float()


def random_positions(
    lengths: Tensor, seq_len: int, random_range: int, generator: torch.Generator
) -> Tensor:
    """Randomized positions: for each row, a sorted, uniformly random ``lengths[b]``-subset of
    ``[0, random_range)``, in its first ``lengths[b]`` slots; the padding slots after it get
    ``random_range, random_range + 1, ...`` (harmless: a causal model never lets a real token see them).

    Args:
        lengths: number of real tokens per row, int64 ``[batch]``, each <= ``seq_len``.
        seq_len: width of the batch.
        random_range: positions are drawn from ``[0, random_range)``; must be >= ``seq_len``.
        generator: the source of randomness.

    Returns:
        int64 ``[batch, seq_len]``, strictly increasing along each row.
    """
    if seq_len > random_range:
        raise ValueError(
            f"a sequence of {seq_len} tokens needs random_range >= {seq_len}, got random_range={random_range}"
        )
    batch = lengths.shape[0]
    # the first k entries of a random permutation are a uniform k-subset
    perm = torch.rand(batch, random_range, generator=generator).argsort(dim=1)
    picked = perm[:, :seq_len]
    slot = torch.arange(seq_len)
    picked = torch.where(slot < lengths[:, None], picked, random_range + slot)
    return picked.sort(dim=1).values


class KVCache:
    """Keys and values of the tokens seen so far, per layer, for incremental (greedy) decoding.

    Buffers for ``capacity`` tokens are allocated at the first write and filled in place (appending with
    ``torch.cat`` would copy the whole cache at every step). ``valid`` (bool ``[batch, t_past]``) says which
    tokens are real: left padding is not.

    Args:
        capacity: the most tokens the cache will hold.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.valid: Tensor | None = None
        self.length = 0

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new keys/values ``[batch, heads, t, head_dim]`` of ``layer`` after the cached ones;
        return all of them, ``[batch, heads, length + t, head_dim]``."""
        if layer == len(self.keys):
            shape = (*k.shape[:2], self.capacity, k.shape[3])
            self.keys.append(k.new_zeros(shape))
            self.values.append(v.new_zeros(shape))
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(
                f"the cache holds {self.capacity} tokens, got {end}; build KVCache(capacity={end})"
            )
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with optional rotary queries/keys or ALiBi bias.

    Args:
        d_model: width of the residual stream.
        n_heads: number of heads; the head width is ``d_model // n_heads``.
        scheme: the positional scheme (rotary and ALiBi act here; the others do nothing here).
    """

    def __init__(self, d_model: int, n_heads: int, scheme: str) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.rotary = None
        if scheme == "rotary":
            self.rotary = RotaryEmbedding(self.head_dim)
        self.alibi = scheme == "alibi"
        if self.alibi:
            self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def forward(
        self,
        x: Tensor,
        positions: Tensor,
        cache: tuple[KVCache, int] | None = None,
        valid: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from the new tokens ``x`` to the cached ones and to themselves.

        Args:
            x: the new tokens, ``[batch, t, d_model]``.
            positions: their positions, int64 ``[t]`` or ``[batch, t]`` (used by
                rotary).
            cache: the cache of the earlier tokens' keys and values and this layer's
                index in it.
            valid: bool ``[batch, t_past + t]``, False for left padding, which no
                token attends to (a padding token attends to itself only); None:
                every token is real.

        Returns:
            ``(y, weights)``: ``y`` ``[batch, t, d_model]`` and the attention weights
            ``[batch, heads, t, t_past + t]``.
        """
        batch, t, d = x.shape
        q, k, v = (
            self.qkv(x)
            .view(batch, t, 3, self.n_heads, self.head_dim)
            .permute(2, 0, 3, 1, 4)
        )  # each [batch, heads, t, head_dim]
        if self.rotary is not None:
            q, k = self.rotary(q, k, positions=positions)
        if cache is not None:
            k, v = cache[0].extend(cache[1], k, v)
        t_all = k.shape[2]
        # q k^T / sqrt(head_dim), the scale applied to q (t x head_dim values, not t x t)
        scores = (q / math.sqrt(self.head_dim)) @ k.transpose(-2, -1)
        # query i (token index t_all - t + i) sees keys j <= its own index
        i = torch.arange(t_all - t, t_all, device=x.device)[:, None]
        j = torch.arange(t_all, device=x.device)[None, :]
        if self.alibi:
            # ALiBi: -m_h * (i - j), a penalty linear in the distance (in tokens)
            scores = scores - self.slopes[:, None, None] * (i - j)
        hidden = j > i  # causal mask [t, t_all]
        if valid is not None:
            hidden = hidden | (~valid[:, None, None, :] & (j != i))
        scores = scores.masked_fill(hidden, float("-inf"))
        weights = scores.softmax(dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(batch, t, d)
        return self.out(y), weights


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attention(LN(x))``, then ``x + MLP(LN(x))``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attention = CausalSelfAttention(
            config.d_model, config.n_heads, config.scheme
        )
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff),
            nn.GELU(),
            nn.Linear(config.d_ff, config.d_model),
        )

    def forward(
        self,
        x: Tensor,
        positions: Tensor,
        cache: tuple[KVCache, int] | None = None,
        valid: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``x``: ``[batch, t, d_model]``; returns the new ``x`` and the attention weights
        (arguments as in :meth:`CausalSelfAttention.forward`)."""
        a, weights = self.attention(self.ln1(x), positions, cache, valid)
        x = x + a
        return x + self.mlp(self.ln2(x)), weights


class TinyDecoder(nn.Module):
    """The decoder: embeddings (plus the additive encoding, if any), blocks, read-out.

    Args:
        config: the architecture and the positional scheme.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        nn.init.normal_(self.embed.weight, std=1.0)
        self.learned = None
        if config.scheme == "learned":
            self.learned = nn.Embedding(config.max_positions, config.d_model)
            nn.init.normal_(self.learned.weight, std=math.sqrt(0.5))
        self.sinusoidal = None
        if config.scheme in ("sinusoidal", "sinusoidal_random"):
            self.sinusoidal = PositionalEncoding(config.d_model, batch_first=True)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def defines(self, seq_len: int) -> bool:
        """Whether the scheme has an encoding for every position of a ``seq_len``-token sequence."""
        return self.learned is None or seq_len <= self.config.max_positions

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        valid: Tensor | None = None,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Next-token logits for every token of ``tokens``.

        Args:
            tokens: int64 ``[batch, t]``: a whole sequence, or the next tokens after
                those in ``cache``.
            positions: int64 ``[t]`` or ``[batch, t]``; default
                ``t_past, ..., t_past + t - 1``, where ``t_past`` is the number of
                tokens in ``cache`` (0 without one). Left padding must be given its
                own positions so that each real sequence starts at 0.
            cache: a :class:`KVCache` to read and extend (incremental decoding), or
                None.
            valid: bool ``[batch, t]``, False for left-padding tokens (batched
                prompts of different lengths); None: all real. Right padding needs no
                mask: under the causal mask no real token sees it.
            return_attention: also return each layer's attention weights.

        Returns:
            logits ``[batch, t, vocab_size]``; with ``return_attention``, also a
            list of ``n_layers`` tensors ``[batch, heads, t, t_past + t]``.

        Raises:
            PositionOutOfRange: for ``"learned"``, a position >= ``max_positions`` (no
                table row).
        """
        t_past = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(
                t_past, t_past + tokens.shape[1], device=tokens.device
            )
        if cache is not None and (valid is not None or cache.valid is not None):
            new = (
                valid
                if valid is not None
                else torch.ones_like(tokens, dtype=torch.bool)
            )
            valid = new if cache.valid is None else torch.cat([cache.valid, new], dim=1)
            cache.valid = valid
        x = self.embed(tokens)
        if self.learned is not None:
            top = int(positions.max())
            if top >= self.config.max_positions:
                rows = self.config.max_positions
                raise PositionOutOfRange(
                    f"the learned table has {rows} rows (positions 0..{rows - 1}, "
                    f"the longest training sequence), got position {top}: a learned "
                    "absolute encoding is not defined past its table; evaluate "
                    f"sequences of at most {rows} tokens, or use a scheme defined "
                    "at every position"
                )
            x = x + self.learned(positions)
        if self.sinusoidal is not None:
            x = self.sinusoidal(x, positions=positions)
        maps = []
        for index, block in enumerate(self.blocks):
            layer_cache = None if cache is None else (cache, index)
            x, weights = block(x, positions, layer_cache, valid)
            maps.append(weights)
        if cache is not None:
            cache.length = t_past + tokens.shape[1]
        logits = self.head(self.ln_f(x))
        return (logits, maps) if return_attention else logits
