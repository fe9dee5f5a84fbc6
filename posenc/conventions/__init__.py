"""Reference modules: the libraries' conventions, built on the core (transformers' rotary modules and configs;
diffusers', timm's and DETR's sin-cos modules and functions). Nothing in the core imports them.

Written by hand (the modules beside it are generated from book/15, 16 and 20): the public names they add.
"""

from posenc.conventions.diffusers import (
    get_3d_rotary_pos_embed,
    swap_rotary_diffusers,
    swap_rotary_timm,
)
from posenc.conventions.hf import (
    HFRotaryEmbedding,
    rotary_embedding_from_config,
    rotated_layers,
    swap_rotary,
)
from posenc.conventions.sincos import (
    PositionEmbeddingSine,
    Timesteps,
    get_2d_sincos_pos_embed,
    get_3d_sincos_pos_embed,
)

__all__ = [
    "HFRotaryEmbedding",
    "PositionEmbeddingSine",
    "Timesteps",
    "get_2d_sincos_pos_embed",
    "get_3d_rotary_pos_embed",
    "get_3d_sincos_pos_embed",
    "rotary_embedding_from_config",
    "rotated_layers",
    "swap_rotary",
    "swap_rotary_diffusers",
    "swap_rotary_timm",
]
