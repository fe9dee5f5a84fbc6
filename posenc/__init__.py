"""posenc: the fixed (sinusoidal) positional encoding of transformers, exact and tested.

Angles are formed in float64 and rounded once to the output dtype: float32 tables are within 2^-24 of the exact
values at positions below 2^24.

    PositionalEncoding      the 2017 encoding added to [seq_len, batch, d_model] (or batch_first) inputs;
                            a drop-in for labml's, spotpython's and the PyTorch tutorial's modules
    sinusoidal_encoding     the table PE[p, 2i] = sin(p·ω_i), PE[p, 2i+1] = cos(p·ω_i), ω_i = base^(-2i/d)
    RotaryEmbedding         rotary position embeddings for queries and keys, with Hugging Face's rope scaling
                            types; RotaryEmbedding.from_hf_config(config) for a checkpoint's layout
    HFRotaryEmbedding       a drop-in for a transformers model's rotary_emb module, read from its config
    timestep_embedding      diffusion time-step embeddings (diffusers' get_timestep_embedding keywords)
    sincos_grid             2-D and 3-D sin-cos tables for image patches and video (MAE, timm, ...)

Each module of the package is written in, and generated from, a chapter of the posenc book (the notebooks in
the repository's book/ folder; the file header names which). help(posenc.<name>) documents each name, with the
shapes of its arguments and results.
"""

from posenc.encoding import frequencies, sinusoidal_encoding
from posenc.hf import HFRotaryEmbedding
from posenc.module import PositionalEncoding, get_positional_encoding
from posenc.offsets import offset_matrix
from posenc.rope_scaling import ROPE_TYPES, rotary_frequencies
from posenc.rotary import RotaryEmbedding, apply_rotary, rotary_cos_sin
from posenc.sincos import (
    GRID_CONVENTIONS,
    detr_sine_encoding,
    sincos_grid,
    timestep_embedding,
)
from posenc.sincos_conventions import PositionEmbeddingSine, Timesteps

__all__ = [
    "GRID_CONVENTIONS",
    "ROPE_TYPES",
    "HFRotaryEmbedding",
    "PositionEmbeddingSine",
    "PositionalEncoding",
    "RotaryEmbedding",
    "Timesteps",
    "apply_rotary",
    "detr_sine_encoding",
    "frequencies",
    "get_positional_encoding",
    "offset_matrix",
    "rotary_cos_sin",
    "rotary_frequencies",
    "sincos_grid",
    "sinusoidal_encoding",
    "timestep_embedding",
]
__version__ = "0.1.0"
