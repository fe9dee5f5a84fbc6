"""posenc: the fixed (sinusoidal) positional encoding of transformers, exact and tested.

Angles are formed in float64 and rounded once to the output dtype: float32 tables are within 2^-24 of the exact
values at positions below 2^24.

    PositionalEncoding      the 2017 encoding added to [seq_len, batch, d_model] (or batch_first) inputs;
                            a drop-in for labml's, spotpython's and the PyTorch tutorial's modules
    sinusoidal_encoding     the table PE[p, 2i] = sin(p·ω_i), PE[p, 2i+1] = cos(p·ω_i), ω_i = base^(-2i/d)
    RotaryEmbedding         rotary position embeddings for queries and keys, with Hugging Face's rope scaling
                            types; RotaryEmbedding.from_hf_config(config) for a checkpoint's layout
    HFRotaryEmbedding       a drop-in for a transformers model's rotary_emb module, read from its config
    swap_rotary             swap_rotary(model): every rotary module of a transformers model replaced by posenc's
    timestep_embedding      diffusion time-step embeddings (diffusers' get_timestep_embedding keywords)
    sincos_grid             2-D and 3-D sin-cos tables for image patches and video (MAE, timm, ...)

The package is laid out as the book is: one subpackage per family (``posenc.sinusoidal``, ``posenc.rotary``,
``posenc.sincos``), the libraries' conventions above them (``posenc.conventions``), and the plumbing every family
shares below them (``posenc._checks``). Each module is written in, and generated from, a chapter of the posenc
book (the notebooks in the repository's book/ folder; the file header names which). help(posenc.<name>)
documents each name, with the shapes of its arguments and results.
"""

# The core (each family's subpackage), then the reference modules built on it.
from posenc.rotary import (
    ROPE_TYPES,
    RotaryEmbedding,
    apply_rotary,
    rotary_cos_sin,
    rotary_frequencies,
)
from posenc.sincos import (
    GRID_CONVENTIONS,
    detr_sine_encoding,
    sincos_grid,
    timestep_embedding,
)
from posenc.sinusoidal import (
    PositionalEncoding,
    frequencies,
    get_positional_encoding,
    offset_matrix,
    sinusoidal_encoding,
)

# isort: split
from posenc.conventions import (
    HFRotaryEmbedding,
    PositionEmbeddingSine,
    Timesteps,
    swap_rotary,
)

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
    "swap_rotary",
    "timestep_embedding",
]
__version__ = "0.1.0"
