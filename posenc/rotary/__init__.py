"""Rotary position embeddings: the rotation, its module, and the rope scalings (one function per rope_type).

Written by hand (the modules beside it are generated from book/06, 13 and 14): the public names of this family.
"""

from posenc.rotary.rotation import RotaryEmbedding, apply_rotary, rotary_cos_sin
from posenc.rotary.scaling import ROPE_TYPES, rotary_frequencies

__all__ = [
    "ROPE_TYPES",
    "RotaryEmbedding",
    "apply_rotary",
    "rotary_cos_sin",
    "rotary_frequencies",
]
