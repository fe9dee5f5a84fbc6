"""posenc: the fixed (sinusoidal) positional encoding of transformers, exact and tested.

The modules are generated from the notebooks in ``book/`` (see ``tools/nbexport.py``); this file, written by
hand, states the public API.
"""

from posenc.encoding import frequencies, sinusoidal_encoding
from posenc.module import PositionalEncoding, get_positional_encoding
from posenc.offsets import offset_matrix
from posenc.rotary import RotaryEmbedding, apply_rotary, rotary_cos_sin

__all__ = [
    "PositionalEncoding",
    "RotaryEmbedding",
    "apply_rotary",
    "frequencies",
    "get_positional_encoding",
    "offset_matrix",
    "rotary_cos_sin",
    "sinusoidal_encoding",
]
__version__ = "0.1.0"
