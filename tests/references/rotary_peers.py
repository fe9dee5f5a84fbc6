"""Rotary peers: the real packages where they install, restatements only where they do not, and a float64 reference.

tests/rotary/test_rotation_peers.py (and book/14_rope_scaling.ipynb, book/15_rotary_conventions.ipynb,
benchmarks/bench_rotary.py) compare posenc with the installed
packages themselves, built here from a config as a model would build them (imported inside the functions, so that
tests/rotary/test_rotation.py, which runs on the torch floor without them, can import this file):

- Hugging Face transformers 5.23 (``LlamaRotaryEmbedding``, ``ROPE_INIT_FUNCTIONS``, ``apply_rotary_pos_emb``);
- rotary-embedding-torch 0.9.1 (lucidrains), diffusers 0.42.1 (Flux), timm 1.0.31 (via tests/references/peers.py).

Restated, because they are not installable packages:

- Meta's Llama reference code, ``llama/model.py`` of github.com/meta-llama/llama at commit
  8580eb9a896bdb82d376b7040d18a2e7b402b10f: ``precompute_freqs_cis`` (``torch.polar`` of float32 angles, complex64),
  ``reshape_for_broadcast``, ``apply_rotary_emb`` on x viewed as complex pairs: the "interleaved" layout, x as
  ``[batch, seq_len, heads, head_dim]`` (the repository needs fairscale and CUDA and is not a pip package);
- the reduced-precision angle recipe reported in EleutherAI/gpt-neox issue #1003 (a reproducer in an issue thread,
  not a package): ``inv_freq`` cast to float16 (or bfloat16) with the model, positions
  ``arange(seq_len).type_as(inv_freq)``, ``einsum('i,j->ij')`` in that dtype, cos and sin of the half-precision
  angles.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

#: Llama 3.1's rope_scaling and rope_theta, as in its config.json (max_position_embeddings there: 131072)
LLAMA31: dict[str, Any] = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}

# ----------------------------------------------------------------------------------------------------------
# Hugging Face transformers (the installed package): a config, its rotary module and its init functions
# ----------------------------------------------------------------------------------------------------------


def hf_config(
    head_dim: int,
    rope_parameters: Mapping[str, Any] | None = None,
    max_position_embeddings: int = 8192,
    **extra: Any,
) -> Any:
    """A ``LlamaConfig`` with this head width and ``rope_parameters`` (copied), 4 heads. A
    ``max_position_embeddings`` key in the dict (posenc reads the config's field from there) becomes the
    config's own field, as in a model's config.json."""
    from transformers import LlamaConfig

    params = copy.deepcopy(dict(rope_parameters or {"rope_type": "default"}))
    params.setdefault("rope_theta", 10000.0)
    max_position_embeddings = params.pop(
        "max_position_embeddings", max_position_embeddings
    )
    return LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=params,
        **extra,
    )


def hf_rotary_embedding(
    head_dim: int,
    rope_parameters: Mapping[str, Any] | None = None,
    max_position_embeddings: int = 8192,
) -> Any:
    """transformers' ``LlamaRotaryEmbedding`` for that config: ``(x, position_ids [batch, seq]) -> (cos, sin)``,
    each ``[batch, seq, head_dim]`` in x's dtype."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(
        hf_config(head_dim, rope_parameters, max_position_embeddings)
    )


def hf_inv_freq(
    head_dim: int,
    rope_parameters: Mapping[str, Any] | None = None,
    max_position_embeddings: int = 8192,
    seq_len: int | None = None,
) -> tuple[Tensor, float]:
    """``ROPE_INIT_FUNCTIONS[rope_type](config, 'cpu', seq_len=...)`` (or the model's default function): the
    float32 ``inv_freq [d / 2]`` and the attention factor, exactly as transformers computes them."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = hf_config(head_dim, rope_parameters, max_position_embeddings)
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)


def hf_rope(
    x: Tensor,
    position_ids: Tensor,
    rotary_dim: int | None = None,
    rope_parameters: Mapping[str, Any] | None = None,
) -> Tensor:
    """The whole Hugging Face path for one tensor x ``[batch, heads, seq_len, head_dim]``: the rotary module's
    tables in x's dtype, then GPT-NeoX's ``apply_rotary_pos_emb`` (which rotates the first ``rotary_dim``
    channels and passes the rest; Llama's is the same for ``rotary_dim = head_dim``)."""
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

    rotary_dim = rotary_dim or x.shape[-1]
    if position_ids.dim() == 1:
        position_ids = position_ids.expand(x.shape[0], -1)
    module = hf_rotary_embedding(rotary_dim, rope_parameters, 1 << 22)
    cos, sin = module(x, position_ids)
    out, _ = apply_rotary_pos_emb(x, x, cos, sin)
    return out


def hf_frequency_bound(rope_parameters: Mapping[str, Any]) -> float:
    """The relative difference allowed between transformers' float32 ``inv_freq`` and posenc's float64 omega_i
    for this dict (book/14_rope_scaling.ipynb derives it): ``2**-24 * K`` with

    - K = ln(base) + 6 for every type (proportional: on the pairs that turn): the float32 exponent 2i/d (its
      rounding moves base^(2i/d) by up to ln(base) * 2**-24), the power, the reciprocal, the factor or per-pair
      factor and its division;
    - plus 2 (s + 1) for yarn: the float32 ramp weights, each off by up to 2**-23, amplified by up to s where the
      result is omega_i / s;
    - plus (s - 1)(1 + 4 h / (h - l)) for llama3: the float32 wavelength and blend weight
      (L / wavelength - l) / (h - l), amplified by up to s - 1 in the blended band.
    """
    base = float(rope_parameters.get("rope_theta", 10000.0))
    rope_type = rope_parameters.get("rope_type", rope_parameters.get("type", "default"))
    k = float(np.log(base)) + 6
    s = float(rope_parameters.get("factor") or 1.0)
    if rope_type == "yarn":
        k += 2 * (s + 1)
    if rope_type == "llama3":
        low = float(rope_parameters["low_freq_factor"])
        high = float(rope_parameters["high_freq_factor"])
        k += (s - 1) * (1 + 4 * high / (high - low))
    return k * 2.0**-24


# ----------------------------------------------------------------------------------------------------------
# Meta's Llama reference code (restated: not installable): complex formulation ("interleaved" layout)
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
# Angles formed in half precision (gpt-neox issue #1003, restated): "half" layout tables
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
    frequencies: Tensor | np.ndarray | None = None,
) -> np.ndarray:
    """The rotation of x ``[..., seq_len, head_dim]`` at positions ``[seq_len]`` or ``[batch, seq_len]``, in
    float64 NumPy: a code path independent of posenc's (NumPy's pow, sin, cos). ``frequencies`` (``[r / 2]``)
    replaces ``base^(-2i/r)``, e.g. by a scaled set. Returns a float64 array of x's shape."""
    xs = x.detach().cpu().double().numpy()
    d = xs.shape[-1]
    r = rotary_dim or d
    p = positions.detach().cpu().numpy().astype(np.float64)
    if p.ndim == 2:  # [batch, seq_len] -> [batch, 1, ..., seq_len]
        p = p.reshape(p.shape[0], *([1] * (xs.ndim - 3)), p.shape[1])
    if frequencies is None:
        omega = np.power(base, -2.0 * np.arange(r // 2) / r)
    else:
        omega = np.asarray(frequencies, dtype=np.float64)
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
