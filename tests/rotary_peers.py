"""The rotary implementations people use, restated in plain torch, and an independent float64 reference.

tests/test_rotary.py checks posenc against each recipe (with the matching layout), and book/10_rotary.ipynb
measures their precision. Each function cites the source file it restates; shapes are as in the source.

- Hugging Face transformers, ``src/transformers/models/llama/modeling_llama.py``: ``LlamaRotaryEmbedding``
  (``inv_freq`` in float32, ``freqs = inv_freq @ position_ids.float()``, ``emb = cat(freqs, freqs)``, cos and
  sin in float32 then cast to x's dtype), ``rotate_half`` and ``apply_rotary_pos_emb``: the "half" layout.
  Partial rotary as in ``models/gpt_neox/modeling_gpt_neox.py``: rotate ``q[..., :rotary_ndims]``, concatenate
  the rest.
- Meta's Llama reference code, ``llama/model.py`` (github.com/meta-llama/llama): ``precompute_freqs_cis``
  (``torch.polar`` of float32 angles, complex64), ``reshape_for_broadcast``, ``apply_rotary_emb`` on x viewed as
  complex pairs: the "interleaved" layout, x as ``[batch, seq_len, heads, head_dim]``.
- lucidrains' rotary-embedding-torch, ``rotary_embedding_torch/rotary_embedding_torch.py``:
  ``RotaryEmbedding.rotate_queries_or_keys`` (positions ``arange(seq_len, dtype=t.dtype) + offset`` divided by
  ``interpolate_factor``, angles by ``einsum`` in float32, each repeated for the two channels of a pair) and
  ``apply_rotary_emb`` with ``rotate_half`` on interleaved pairs (``rearrange('... (d r) -> ... d r', r=2)``).
- Reduced-precision angle recipes, as reported in EleutherAI/gpt-neox issue #1003: ``inv_freq`` cast to float16
  (or bfloat16) with the model, positions ``arange(seq_len).type_as(inv_freq)``, ``einsum('i,j->ij')`` in that
  dtype, cos and sin of the half-precision angles.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

# ----------------------------------------------------------------------------------------------------------
# Hugging Face transformers: LlamaRotaryEmbedding + rotate_half + apply_rotary_pos_emb ("half" layout)
# ----------------------------------------------------------------------------------------------------------


def hf_inv_freq(dim: int, base: float = 10000.0) -> Tensor:
    """``LlamaRotaryEmbedding.__init__``: ``[dim / 2]`` float32."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def hf_cos_sin(
    position_ids: Tensor,
    dim: int,
    dtype: torch.dtype = torch.float32,
    base: float = 10000.0,
    scaling_factor: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """``LlamaRotaryEmbedding.forward`` (and ``LlamaLinearScalingRotaryEmbedding`` for ``scaling_factor != 1``).

    Args:
        position_ids: ``[batch, seq_len]`` integer positions.
        dim: rotated channels.
        dtype: x's dtype, to which cos and sin are cast.

    Returns:
        ``(cos, sin)``, each ``[batch, seq_len, dim]``.
    """
    inv_freq = hf_inv_freq(dim, base).to(position_ids.device)
    if scaling_factor != 1.0:
        position_ids = position_ids.float() / scaling_factor
    inv_freq_expanded = (
        inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    )
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype=dtype), emb.sin().to(dtype=dtype)


def hf_rotate_half(x: Tensor) -> Tensor:
    """``rotate_half``: ``[..., d] -> [..., d]``."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_apply_rotary_pos_emb(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
) -> tuple[Tensor, Tensor]:
    """``apply_rotary_pos_emb``: q, k ``[batch, heads, seq_len, dim]``, cos, sin ``[batch, seq_len, dim]``."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (hf_rotate_half(q) * sin)
    k_embed = (k * cos) + (hf_rotate_half(k) * sin)
    return q_embed, k_embed


def hf_rope(
    x: Tensor,
    position_ids: Tensor,
    rotary_dim: int | None = None,
    base: float = 10000.0,
    scaling_factor: float = 1.0,
) -> Tensor:
    """The whole Hugging Face path for one tensor x ``[batch, heads, seq_len, head_dim]``, partial rotary as in
    GPT-NeoX's modeling code (rotate the first ``rotary_dim`` channels, concatenate the rest)."""
    rotary_dim = rotary_dim or x.shape[-1]
    if position_ids.dim() == 1:
        position_ids = position_ids.expand(x.shape[0], -1)
    cos, sin = hf_cos_sin(position_ids, rotary_dim, x.dtype, base, scaling_factor)
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    x_rot, _ = hf_apply_rotary_pos_emb(x_rot, x_rot, cos, sin)
    return torch.cat((x_rot, x_pass), dim=-1)


# ----------------------------------------------------------------------------------------------------------
# Meta's Llama reference code: complex formulation ("interleaved" layout)
# ----------------------------------------------------------------------------------------------------------


def llama_precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> Tensor:
    """``precompute_freqs_cis``: ``[end, dim / 2]`` complex64."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # complex64
    return freqs_cis


def llama_reshape_for_broadcast(freqs_cis: Tensor, x: Tensor) -> Tensor:
    """``reshape_for_broadcast``: ``[seq_len, dim / 2]`` -> broadcastable against x
    ``[batch, seq_len, heads, dim / 2]``."""
    ndim = x.ndim
    assert freqs_cis.shape == (x.shape[1], x.shape[-1])
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def llama_apply_rotary_emb(
    xq: Tensor, xk: Tensor, freqs_cis: Tensor
) -> tuple[Tensor, Tensor]:
    """``apply_rotary_emb``: xq, xk ``[batch, seq_len, heads, head_dim]``, freqs_cis ``[seq_len, head_dim / 2]``."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = llama_reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def llama_rope(x: Tensor, start_pos: int = 0, base: float = 10000.0) -> Tensor:
    """The Llama path for one tensor x ``[batch, heads, seq_len, head_dim]`` (transposed to the source's
    ``[batch, seq_len, heads, head_dim]`` and back), at positions ``start_pos, ..., start_pos + seq_len - 1``
    (``Transformer.forward`` slices ``freqs_cis[start_pos : start_pos + seqlen]``)."""
    seq_len = x.shape[-2]
    freqs_cis = llama_precompute_freqs_cis(x.shape[-1], start_pos + seq_len, base)
    freqs_cis = freqs_cis[start_pos : start_pos + seq_len]
    xt = x.transpose(1, 2)
    out, _ = llama_apply_rotary_emb(xt, xt, freqs_cis)
    return out.transpose(1, 2)


# ----------------------------------------------------------------------------------------------------------
# lucidrains' rotary-embedding-torch: rotate_queries_or_keys ("interleaved" layout)
# ----------------------------------------------------------------------------------------------------------


def lucidrains_rotate_half(x: Tensor) -> Tensor:
    """``rotate_half`` on interleaved pairs: ``rearrange(x, '... (d r) -> ... d r', r=2)``, ``(-x2, x1)``, back."""
    x = x.unflatten(-1, (-1, 2))
    x1, x2 = x.unbind(dim=-1)
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)


def lucidrains_rotate_queries_or_keys(
    t: Tensor,
    dim: int,
    offset: int = 0,
    theta: float = 10000.0,
    interpolate_factor: float = 1.0,
) -> Tensor:
    """``RotaryEmbedding(dim, theta=theta, interpolate_factor=...).rotate_queries_or_keys(t, offset=offset)``
    with ``t`` ``[..., seq_len, head_dim]`` (``seq_dim=-2``); the first ``dim`` channels are rotated."""
    dtype, seq_len = t.dtype, t.shape[-2]
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    # get_seq_pos: the positions in t's dtype
    seq = (
        torch.arange(seq_len, device=t.device, dtype=dtype) + offset
    ) / interpolate_factor
    # forward: einsum('..., f -> ... f', t.type(freqs.dtype), freqs), repeat '... n -> ... (n r)', r=2
    freqs = torch.einsum("..., f -> ... f", seq.type(freqs.dtype), freqs.to(t.device))
    freqs = freqs.repeat_interleave(2, dim=-1)
    # apply_rotary_emb(freqs, t, start_index=0, scale=1.0)
    rot_dim = freqs.shape[-1]
    t_left, t_middle, t_right = t[..., :0], t[..., :rot_dim], t[..., rot_dim:]
    t_transformed = (t_middle * freqs.cos() * 1.0) + (
        lucidrains_rotate_half(t_middle) * freqs.sin() * 1.0
    )
    out = torch.cat((t_left, t_transformed, t_right), dim=-1)
    return out.type(dtype)


# ----------------------------------------------------------------------------------------------------------
# Angles formed in half precision (gpt-neox issue #1003): "half" layout tables
# ----------------------------------------------------------------------------------------------------------


def half_angle_cos_sin(
    seq_len: int, dim: int, dtype: torch.dtype, base: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """cos and sin ``[seq_len, dim]`` with ``inv_freq`` and the positions in ``dtype`` (float16 or bfloat16)
    and the angles formed by ``einsum`` in that dtype, as in the issue's reproducer."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
    inv_freq = inv_freq.to(dtype)
    t = torch.arange(seq_len).type_as(inv_freq)
    freqs = torch.einsum("i,j->ij", t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


# ----------------------------------------------------------------------------------------------------------
# Independent float64 reference (NumPy)
# ----------------------------------------------------------------------------------------------------------


def numpy_rotation(
    x: Tensor,
    positions: Tensor,
    *,
    rotary_dim: int | None = None,
    base: float = 10000.0,
    layout: str = "interleaved",
    scale: float = 1.0,
) -> np.ndarray:
    """The rotation of x ``[..., seq_len, head_dim]`` at positions ``[seq_len]`` or ``[batch, seq_len]``, in
    float64 NumPy: a code path independent of posenc's (NumPy's pow, sin, cos). Returns a float64 array of x's
    shape."""
    xs = x.detach().cpu().double().numpy()
    d = xs.shape[-1]
    r = rotary_dim or d
    p = positions.detach().cpu().numpy().astype(np.float64) / scale
    if p.ndim == 2:  # [batch, seq_len] -> [batch, 1, ..., seq_len]
        p = p.reshape(p.shape[0], *([1] * (xs.ndim - 3)), p.shape[1])
    omega = np.power(base, -2.0 * np.arange(r // 2) / r)
    theta = p[..., None] * omega  # [..., seq_len, r / 2]
    c, s = np.cos(theta), np.sin(theta)
    if layout == "interleaved":
        a, b = xs[..., 0:r:2], xs[..., 1:r:2]
    else:
        a, b = xs[..., : r // 2], xs[..., r // 2 : r]
    out = xs.copy()
    ra, rb = a * c - b * s, b * c + a * s
    if layout == "interleaved":
        out[..., 0:r:2], out[..., 1:r:2] = ra, rb
    else:
        out[..., : r // 2], out[..., r // 2 : r] = ra, rb
    return out


def pair_norms(
    x: Tensor, rotary_dim: int | None = None, layout: str = "interleaved"
) -> Tensor:
    """The norm of the pair each channel belongs to, float64, x's shape (0 on channels that are not rotated)."""
    xd = x.detach().double()
    r = rotary_dim or x.shape[-1]
    out = torch.zeros_like(xd)
    if layout == "interleaved":
        n = xd[..., :r].unflatten(-1, (-1, 2)).norm(dim=-1)  # [..., r / 2]
        out[..., :r] = n.repeat_interleave(2, dim=-1)
    else:
        n = torch.stack((xd[..., : r // 2], xd[..., r // 2 : r]), dim=-1).norm(dim=-1)
        out[..., :r] = torch.cat((n, n), dim=-1)
    return out
