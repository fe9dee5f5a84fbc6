"""The 2017 encoding: its frequencies, the table, the module that adds it, relative offsets.

Written by hand (the modules beside it are generated from book/01-03): the public names of this family.
"""

from posenc.sinusoidal.encoding import frequencies, sinusoidal_encoding
from posenc.sinusoidal.module import PositionalEncoding, get_positional_encoding
from posenc.sinusoidal.offsets import offset_matrix

__all__ = [
    "PositionalEncoding",
    "frequencies",
    "get_positional_encoding",
    "offset_matrix",
    "sinusoidal_encoding",
]
