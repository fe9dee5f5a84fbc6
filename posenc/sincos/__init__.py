"""The same sines on other axes: diffusion time steps, 2-D and 3-D grids of patches, DETR's image positions.

Written by hand (the module beside it is generated from book/07): the public names of this family.
"""

from posenc.sincos.embeddings import (
    GRID_CONVENTIONS,
    detr_sine_encoding,
    sincos_grid,
    timestep_embedding,
)

__all__ = [
    "GRID_CONVENTIONS",
    "detr_sine_encoding",
    "sincos_grid",
    "timestep_embedding",
]
