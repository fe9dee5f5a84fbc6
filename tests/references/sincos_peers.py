"""Timestep embeddings and grid tables as published, restated from their sources, with the bounds they are held to.

book/07_timesteps_and_grids.ipynb, book/17_sincos_conventions.ipynb and tests/sincos/test_embeddings*.py compare
posenc with each of them. Every function keeps its source's arithmetic (order of operations, ``exp`` of a logarithm
or a power, division or multiplication); ``dtype`` (where given) is the source's float32 by default, and float64
gives the same formula without float32 rounding. The sources, read at the commits named:

- DDPM, github.com/hojonathanho/diffusion, ``diffusion_tf/nn.py`` at c46129977747dad96f91709bcb3f0f7480686004:
  ``get_timestep_embedding`` (TensorFlow, ``DEFAULT_DTYPE = tf.float32``), restated in torch.
- ADM, github.com/openai/guided-diffusion, ``guided_diffusion/nn.py`` at
  aca3097a89fab9c9962b22224d5f48950eb57e29: ``timestep_embedding``. DiT, github.com/facebookresearch/DiT,
  ``models.py`` at 4961bcb01370bc5a552909b2f4c1b0f096e3f79e: ``TimestepEmbedder.timestep_embedding`` is the same
  code line for line (it cites GLIDE's copy), so one function restates both.
- MAE, github.com/facebookresearch/mae, ``util/pos_embed.py`` at be47fef7a727943547afb0c670cf1b26034c3c89:
  ``get_2d_sincos_pos_embed`` and its helpers (NumPy, float64 frequencies, float32 grid); DiT's ``models.py``
  (same commit as above) copies them with ``np.float64`` and an ``extra_tokens`` argument.
- MoCo v3, github.com/facebookresearch/moco-v3, ``vits.py`` at 38aae447f5e8f5a6221dbff0d8db40012512fe32:
  ``VisionTransformerMoCo.build_2d_sincos_position_embedding`` (without its zero [cls] row).
- Big Vision, github.com/google-research/big_vision, ``big_vision/models/vit.py`` at
  5f95305cdb93f8da81fb21178a5024cff5ad4f96: ``posemb_sincos_2d`` (JAX; restated in NumPy in JAX's default
  float32).
- DETR, github.com/facebookresearch/detr, ``models/position_encoding.py`` at
  70a59831a3da8b4b60772ccf4dad3bd17c738fe4: ``PositionEmbeddingSine.forward`` (from the mask of a
  ``NestedTensor``).
- NeRF, github.com/bmild/nerf, ``run_nerf_helpers.py`` at c39def3944c982aa7aabeacdd2e856c07da39b9e:
  ``Embedder`` with ``get_embedder``'s settings (TensorFlow, restated in torch).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

U32 = 2.0**-24  # float32 unit roundoff
U64 = 2.0**-53  # float64 unit roundoff


def float32_bound(theta: Tensor, base: float) -> Tensor:
    """How far a float32 recipe may be from the exact value, elementwise: ``(3 ln base + 5) u |θ| + 2u``, u = 2^-24.

    The recipes round the exponent of the frequencies (up to three roundings of a number of size <= ln base,
    magnified by exp or pow into a relative error of the frequency), the frequency itself, the position and the
    product (each one relative rounding), then take a float32 sine or cosine within 2 ulp (2u for values below 1).
    The angle is then off by at most ``(3 ln base + 5) u |θ|``, and so is its sine. ``theta``: the exact angles,
    any shape."""
    return (3 * math.log(base) + 5) * U32 * theta.abs() + 2 * U32


def float64_bound(theta_max: float, base: float) -> float:
    """Two float64 roads to the same table agree within ``(8 ln base + 8) 2^-53 θ_max + 2^-50`` (chapter 05's
    eq-peer-bound, with the largest angle in place of the largest position)."""
    return (8 * math.log(base) + 8) * U64 * theta_max + 2**-50


# ----------------------------------------------------------------------------------------------------------
# Time steps
# ----------------------------------------------------------------------------------------------------------


def ddpm_get_timestep_embedding(
    timesteps: Tensor, embedding_dim: int, dtype: torch.dtype = torch.float32
) -> Tensor:
    """DDPM's ``get_timestep_embedding`` ("From Fairseq"): ``[N] -> [N, embedding_dim]``, sin first, h - 1."""
    assert len(timesteps.shape) == 1
    half_dim = embedding_dim // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = torch.exp(torch.arange(half_dim, dtype=dtype) * -emb)
    emb = timesteps.to(dtype)[:, None] * emb[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)
    if embedding_dim % 2 == 1:  # zero pad
        emb = torch.nn.functional.pad(emb, [0, 1])
    assert emb.shape == (timesteps.shape[0], embedding_dim)
    return emb


def adm_timestep_embedding(
    timesteps: Tensor,
    dim: int,
    max_period: float = 10000,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """guided-diffusion's (and DiT's) ``timestep_embedding``: ``[N] -> [N, dim]``, cos first, h."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(start=0, end=half, dtype=dtype) / half
    ).to(device=timesteps.device)
    args = timesteps[:, None].to(dtype) * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
    return embedding


# ----------------------------------------------------------------------------------------------------------
# Grids
# ----------------------------------------------------------------------------------------------------------


def _mae_1d(embed_dim: int, pos: np.ndarray) -> np.ndarray:
    """``get_1d_sincos_pos_embed_from_grid``: ``(M,) -> (M, embed_dim)``."""
    assert embed_dim % 2 == 0
    omega = np.arange(embed_dim // 2, dtype=np.float64)
    omega /= embed_dim / 2.0
    omega = 1.0 / 10000**omega  # (D/2,)
    pos = pos.reshape(-1)  # (M,)
    out = np.einsum("m,d->md", pos, omega)  # (M, D/2), outer product
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)  # (M, D)


def mae_2d_sincos_pos_embed(embed_dim: int, grid_size: int) -> np.ndarray:
    """MAE's ``get_2d_sincos_pos_embed`` (square grids only): ``[grid_size**2, embed_dim]`` float64."""
    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.meshgrid(grid_w, grid_h)  # here w goes first
    grid = np.stack(grid, axis=0)
    grid = grid.reshape([2, 1, grid_size, grid_size])
    assert embed_dim % 2 == 0
    emb_h = _mae_1d(embed_dim // 2, grid[0])  # (H*W, D/2)
    emb_w = _mae_1d(embed_dim // 2, grid[1])  # (H*W, D/2)
    return np.concatenate([emb_h, emb_w], axis=1)  # (H*W, D)


def mocov3_2d_sincos(
    h: int,
    w: int,
    embed_dim: int,
    temperature: float = 10000.0,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """MoCo v3's ``build_2d_sincos_position_embedding`` for a patch grid ``(h, w)``: ``[h * w, embed_dim]``."""
    grid_w = torch.arange(w, dtype=dtype)
    grid_h = torch.arange(h, dtype=dtype)
    # indexing="ij": the default of the torch it was written for
    grid_w, grid_h = torch.meshgrid(grid_w, grid_h, indexing="ij")
    assert embed_dim % 4 == 0
    pos_dim = embed_dim // 4
    omega = torch.arange(pos_dim, dtype=dtype) / pos_dim
    omega = 1.0 / (temperature**omega)
    out_w = torch.einsum("m,d->md", [grid_w.flatten(), omega])
    out_h = torch.einsum("m,d->md", [grid_h.flatten(), omega])
    return torch.cat(
        [torch.sin(out_w), torch.cos(out_w), torch.sin(out_h), torch.cos(out_h)], dim=1
    )


def big_vision_posemb_sincos_2d(
    h: int, w: int, width: int, temperature: float = 10_000.0, dtype: type = np.float32
) -> np.ndarray:
    """Big Vision's ``posemb_sincos_2d`` ("Follows the MoCo v3 logic"): ``[h * w, width]`` (without the batch axis).

    ``jnp.arange`` gives int32 and JAX computes in float32 unless x64 is enabled; NumPy does the same here with
    ``dtype=np.float32`` (``np.float64`` for the formula without float32 rounding)."""
    y, x = np.mgrid[:h, :w]
    assert width % 4 == 0, "Width must be mult of 4 for sincos posemb"
    omega = np.arange(width // 4, dtype=dtype) / dtype(width // 4 - 1)
    omega = dtype(1.0) / (dtype(temperature) ** omega)
    y = np.einsum("m,d->md", y.flatten().astype(dtype), omega)
    x = np.einsum("m,d->md", x.flatten().astype(dtype), omega)
    pe = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
    return np.asarray(pe, dtype)


def detr_position_embedding_sine(
    mask: Tensor,
    num_pos_feats: int = 64,
    temperature: float = 10000,
    normalize: bool = False,
    scale: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """DETR's ``PositionEmbeddingSine(num_pos_feats, temperature, normalize, scale)(NestedTensor(x, mask))``:
    mask ``[batch, h, w]`` (True where padded) -> ``[batch, 2 num_pos_feats, h, w]``."""
    if scale is not None and normalize is False:
        raise ValueError("normalize should be True if scale is passed")
    if scale is None:
        scale = 2 * math.pi
    not_mask = ~mask
    y_embed = not_mask.cumsum(1, dtype=dtype)
    x_embed = not_mask.cumsum(2, dtype=dtype)
    if normalize:
        eps = 1e-6
        y_embed = y_embed / (y_embed[:, -1:, :] + eps) * scale
        x_embed = x_embed / (x_embed[:, :, -1:] + eps) * scale
    dim_t = torch.arange(num_pos_feats, dtype=dtype, device=mask.device)
    dim_t = temperature ** (2 * (dim_t // 2) / num_pos_feats)
    pos_x = x_embed[:, :, :, None] / dim_t
    pos_y = y_embed[:, :, :, None] / dim_t
    pos_x = torch.stack(
        (pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4
    ).flatten(3)
    pos_y = torch.stack(
        (pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4
    ).flatten(3)
    return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


def nerf_embed(
    inputs: Tensor, multires: int, dtype: torch.dtype = torch.float32
) -> Tensor:
    """NeRF's ``get_embedder(multires)`` applied to ``inputs`` ``[..., 3]``: ``[..., 3 + 6 multires]``.

    ``include_input=True``, frequencies ``2.**linspace(0, multires - 1, multires)`` (``log_sampling``), and for
    each frequency ``sin(x * freq)``, then ``cos(x * freq)`` of all three coordinates: no factor π (the paper's
    γ(p) has one)."""
    x = inputs.to(dtype)
    freq_bands = 2.0 ** torch.linspace(0.0, multires - 1, multires, dtype=dtype)
    embed = [x]
    for freq in freq_bands:
        for p_fn in (torch.sin, torch.cos):
            embed.append(p_fn(x * freq))
    return torch.cat(embed, -1)
