"""posenc's time-step embeddings, grid tables and DETR encoding against the installed diffusers, timm and transformers.

Each peer computes in float32 (diffusers' 2-D and 3-D tables in float64 from float32 positions), so its output is
compared with posenc's float64 values within its own float32 error, the bound ``float32_bound`` of
tests/references/sincos_peers.py (eq-ts-float32 in book/17_sincos_conventions.ipynb), which is stated there and
measured here: the peers' actual error is reported to be nonzero and inside the bound, and a wrong convention lies far
outside it. Which settings diffusers' models use is read from the installed package, as the chapter's tables say.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from posenc import (
    Timesteps,
    detr_sine_encoding,
    sincos_grid,
    timestep_embedding,
)
from tests.references.peers import Lazy, require, timm_pos_embed_sincos
from tests.references.sincos_peers import (
    adm_timestep_embedding,
    detr_position_embedding_sine,
    float32_bound,
    float64_bound,
)

F64 = torch.float64
embeddings = Lazy(
    "diffusers.models.embeddings"
)  # imported by the first test that uses it


def _angles(
    t: torch.Tensor, dim: int, shift: float, scale: float = 1.0
) -> torch.Tensor:
    """The angle behind each channel of a time-step embedding: ``[N, dim]``."""
    half = dim // 2
    omega = 1e4 ** (-torch.arange(half, dtype=F64) / (half - shift))
    theta = (scale * t.double()[:, None] * omega).repeat(1, 2)
    return torch.nn.functional.pad(theta, (0, dim % 2))


def _grid_angles(shape, dim, scale=1.0) -> torch.Tensor:
    """A bound on the angle of every entry of a grid table (the largest scaled index of the token)."""
    scale = scale if isinstance(scale, tuple) else (scale,) * len(shape)
    idx = torch.meshgrid(
        *[torch.arange(s, dtype=F64) / k for s, k in zip(shape, scale)], indexing="ij"
    )
    top = torch.stack(idx).flatten(1).amax(0)
    return top[:, None].expand(-1, dim)


# ----------------------------------------------------------------------------------------------------------
# Time steps
# ----------------------------------------------------------------------------------------------------------

CASES = [  # (flip_sin_to_cos, downscale_freq_shift, dim)
    (False, 1, 320),
    (True, 0, 256),
    (True, 1, 256),
    (False, 0, 64),
    (False, 1, 321),
    (True, 0, 7),
    (True, 1, 9),
    (True, 0, 1280),
]


@pytest.mark.parametrize(("flip", "shift", "dim"), CASES)
def test_get_timestep_embedding_within_its_float32_error(flip, shift, dim):
    torch.manual_seed(dim)
    kw = {"flip_sin_to_cos": flip, "downscale_freq_shift": shift}
    for t in (torch.randint(0, 1000, (300,)), torch.rand(300) * 1000):
        exact = timestep_embedding(t, dim, **kw, dtype=F64)
        theirs = embeddings.get_timestep_embedding(t, dim, **kw)
        assert theirs.shape == exact.shape and theirs.dtype == torch.float32
        error = (theirs.double() - exact).abs()
        assert (error <= float32_bound(_angles(t, dim, shift), 1e4)).all()
        ours = timestep_embedding(t, dim, **kw)
        assert (ours.double() - exact).abs().max() <= 2**-24
        if dim >= 64:  # diffusers' float32 recipe drifts with t; posenc does not
            assert error[t > 500].max() > 1e-6
    if (flip, shift, dim) == (False, 1, 320):  # the chapter: "about 1e-4 near t = 1000"
        steps = torch.arange(900, 1000.0)
        error = embeddings.get_timestep_embedding(steps, 320).double()
        error = (error - timestep_embedding(steps, 320, dtype=F64)).abs().max()
        assert 1e-5 < error < 1e-3


def test_scale_and_a_wrong_convention():
    t = torch.rand(
        200
    )  # fractional time in [0, 1] with scale=1000, Qwen-Image's setting
    kw = {"flip_sin_to_cos": True, "downscale_freq_shift": 0, "scale": 1000}
    theirs = embeddings.get_timestep_embedding(t, 256, **kw)
    exact = timestep_embedding(t, 256, **kw, dtype=F64)
    bound = float32_bound(_angles(t, 256, 0, 1000.0), 1e4)
    assert ((theirs.double() - exact).abs() <= bound).all()
    # the other shift, or the other half first, is far outside the bound
    for wrong in ({"downscale_freq_shift": 1}, {"flip_sin_to_cos": False}):
        other = embeddings.get_timestep_embedding(t, 256, **{**kw, **wrong})
        assert ((other.double() - exact).abs() > bound).any()


def test_diffusers_gives_nan_where_posenc_refuses():
    # dim // 2 - downscale_freq_shift = 0: diffusers divides by it
    nan = embeddings.get_timestep_embedding(torch.tensor([10.0]), 2)
    assert torch.isnan(nan).any()
    with pytest.raises(ValueError, match="downscale_freq_shift"):
        timestep_embedding(torch.tensor([10.0]), 2)


def test_timesteps_module_replaces_diffusers_timesteps():
    t = torch.rand(64) * 1000
    for args in ((320, True, 0), (256, True, 1), (320, False, 1, 2.0)):
        theirs = embeddings.Timesteps(*args)(t)
        ours = Timesteps(*args)(t)
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        scale = args[3] if len(args) > 3 else 1.0
        bound = float32_bound(_angles(t, args[0], args[2], scale), 1e4)
        assert ((theirs.double() - ours.double()).abs() <= bound + 2**-24).all()


def test_which_models_use_which_setting():
    diffusers = require("diffusers")
    # the classes the chapter's table names, read from the installed package
    settings = {
        "CombinedTimestepLabelEmbeddings": embeddings.CombinedTimestepLabelEmbeddings(
            10, 16
        ),
        "CombinedTimestepTextProjEmbeddings": embeddings.CombinedTimestepTextProjEmbeddings(
            16, 8
        ),
        "CombinedTimestepGuidanceTextProjEmbeddings": (
            embeddings.CombinedTimestepGuidanceTextProjEmbeddings(16, 8)
        ),
        "PixArtAlphaCombinedTimestepSizeEmbeddings": (
            embeddings.PixArtAlphaCombinedTimestepSizeEmbeddings(16, 0)
        ),
    }
    found = {
        name: (m.time_proj.flip_sin_to_cos, m.time_proj.downscale_freq_shift)
        for name, m in settings.items()
    }
    assert found == {
        "CombinedTimestepLabelEmbeddings": (True, 1),  # the DiT port
        "CombinedTimestepTextProjEmbeddings": (True, 0),  # SD3, Flux
        "CombinedTimestepGuidanceTextProjEmbeddings": (True, 0),  # Flux with guidance
        "PixArtAlphaCombinedTimestepSizeEmbeddings": (True, 0),  # PixArt
    }
    qwen = require("diffusers.models.transformers.transformer_qwenimage")
    proj = qwen.QwenTimestepProjEmbeddings(16).time_proj
    assert (proj.flip_sin_to_cos, proj.downscale_freq_shift, proj.scale) == (
        True,
        0,
        1000,
    )
    unet = inspect.signature(diffusers.UNet2DConditionModel.__init__).parameters
    assert unet["flip_sin_to_cos"].default is True and unet["freq_shift"].default == 0
    # and which model holds which class: tiny instances of the real model classes
    dit = diffusers.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=1,
        sample_size=8, patch_size=2, num_embeds_ada_norm=10,
    )  # fmt: skip
    assert isinstance(
        dit.transformer_blocks[0].norm1.emb, embeddings.CombinedTimestepLabelEmbeddings
    )
    sd3 = diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
        pooled_projection_dim=8, out_channels=4, pos_embed_max_size=8,
    )  # fmt: skip
    assert isinstance(
        sd3.time_text_embed, embeddings.CombinedTimestepTextProjEmbeddings
    )
    flux = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
        pooled_projection_dim=8, guidance_embeds=True, axes_dims_rope=(2, 2, 4),
    )  # fmt: skip
    assert isinstance(
        flux.time_text_embed, embeddings.CombinedTimestepGuidanceTextProjEmbeddings
    )
    pixart = diffusers.PixArtTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
        num_layers=1, cross_attention_dim=16, sample_size=8, patch_size=2,
        caption_channels=16,
    )  # fmt: skip
    assert isinstance(
        pixart.adaln_single.emb, embeddings.PixArtAlphaCombinedTimestepSizeEmbeddings
    )


def test_the_dit_port_shift_and_its_fix():
    port = embeddings.CombinedTimestepLabelEmbeddings(1000, 1152).eval()
    t = torch.arange(1000)
    dit = adm_timestep_embedding(t, 256, dtype=F64)  # DiT's TimestepEmbedder, float64
    gap = (port.time_proj(t).double() - dit).abs().amax(-1)  # diffusers' float32 output
    assert round(gap[999].item(), 2) == 1.94
    # through the real time MLP, initialised as DiT initialises it (seeded)
    torch.manual_seed(0)
    mlp = embeddings.TimestepEmbedding(in_channels=256, time_embed_dim=1152).double()
    for layer in (mlp.linear_1, mlp.linear_2):
        torch.nn.init.normal_(layer.weight, std=0.02)
        torch.nn.init.zeros_(layer.bias)
    with torch.no_grad():
        c_dit = mlp(dit)
        c_port = mlp(port.time_proj(t).double())
    moved = (c_port - c_dit).norm(dim=-1)
    one_step = (c_dit[1:] - c_dit[:-1]).norm(dim=-1)
    assert (
        moved[999] / one_step[998] > 3
    )  # the port moves it farther than one step does
    assert moved[10] / one_step[9] < 0.5  # small at small t
    # the fix: posenc's stateless Timesteps as time_proj; the checkpoint still loads
    state = {k: v.clone() for k, v in port.state_dict().items()}
    port.time_proj = Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)
    port.load_state_dict(state, strict=True)
    labels = torch.tensor([1, 500, 1000])
    steps = torch.tensor([999, 500, 3])
    with torch.no_grad():
        after = port(steps, labels, hidden_dtype=torch.float32)
        freq = adm_timestep_embedding(steps, 256, dtype=F64).float()
        expected = port.timestep_embedder(freq) + port.class_embedder(labels)
    torch.testing.assert_close(after, expected, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------
# Grids
# ----------------------------------------------------------------------------------------------------------


def _within(theirs, shape, dim, convention, scale=1.0, float32=True) -> bool:
    ours = sincos_grid(
        shape, dim, convention=convention, interpolation_scale=scale, dtype=F64
    )
    diff = (torch.as_tensor(theirs).double().reshape(ours.shape) - ours).abs()
    theta = _grid_angles(shape, dim, scale)
    if float32:
        return bool((diff <= float32_bound(theta, 1e4)).all())
    return diff.max().item() <= float64_bound(theta.max().item(), 1e4)


SHAPES_2D = [((8, 8), 64), ((6, 10), 64), ((7, 3), 12), ((16, 16), 384), ((5, 9), 96)]


@pytest.mark.parametrize(("shape", "dim"), SHAPES_2D)
def test_diffusers_2d_table(shape, dim):
    h, w = shape
    # at base_size = the number of rows: rows unscaled, columns scaled by w / h
    theirs = embeddings.get_2d_sincos_pos_embed(dim, shape, base_size=h)
    assert theirs.dtype == F64
    assert _within(theirs, shape, dim, "mae", scale=(1.0, w / h))
    if h == w:  # MAE's table exactly, in float64
        assert _within(theirs, shape, dim, "mae", float32=False)
    # PixArt-style resolution scaling, and the default base_size of 16
    for base_size, interp in ((16, 2.0), (16, 1.0), (32, 0.5)):
        theirs = embeddings.get_2d_sincos_pos_embed(
            dim, shape, base_size=base_size, interpolation_scale=interp
        )
        scale = (h * interp / base_size, w * interp / base_size)
        assert _within(theirs, shape, dim, "mae", scale=scale)
    # a wrong convention is outside the bound
    assert not _within(theirs, shape, dim, "mocov3", scale=scale)


@pytest.mark.parametrize(
    ("shape", "dim", "scales"),
    [
        ((4, 6, 10), 64, (1.0, 1.0)),
        ((13, 6, 9), 1920, (1.875, 1.0)),
        ((3, 5, 3), 32, (2.0, 0.5)),
    ],
)
def test_diffusers_3d_table(shape, dim, scales):
    t, h, w = shape
    spatial, temporal = scales
    theirs = embeddings.get_3d_sincos_pos_embed(dim, (w, h), t, spatial, temporal)
    assert theirs.shape == (t, h * w, dim)
    assert _within(
        theirs.flatten(0, 1),
        shape,
        dim,
        "diffusers_3d",
        scale=(temporal, spatial, spatial),
    )


@pytest.mark.parametrize(("shape", "dim"), SHAPES_2D)
def test_timm_table(shape, dim):
    sincos = timm_pos_embed_sincos()  # the installed timm/layers/pos_embed_sincos.py
    h, w = shape
    assert _within(sincos.build_sincos2d_pos_embed([h, w], dim), shape, dim, "timm")
    interleaved = sincos.build_sincos2d_pos_embed([h, w], dim, interleave_sin_cos=True)
    assert _within(interleaved, shape, dim, "mocov3")
    assert not _within(interleaved, shape, dim, "timm")
    # reverse_coord: the table of the transposed grid
    reverse = sincos.build_sincos2d_pos_embed([h, w], dim, reverse_coord=True)
    assert _within(reverse, (w, h), dim, "timm")
    if h != w:
        assert not _within(reverse, shape, dim, "timm")


def test_patch_embed_fails_on_non_square_grids_unless_cropped():
    h, w, patch, dim = 3, 5, 8, 16
    embed = embeddings.PatchEmbed(
        height=h * patch,
        width=w * patch,
        patch_size=patch,
        in_channels=3,
        embed_dim=dim,
    )
    assert embed.pos_embed.shape == (1, 9, dim)  # int(sqrt(15)) ** 2 rows
    with pytest.raises(RuntimeError, match="must match"):
        embed(torch.randn(1, 3, h * patch, w * patch))
    # SD3's pos_embed_max_size: a square table, cropped at the centre: right
    cropped = embeddings.PatchEmbed(
        height=h * patch, width=w * patch, patch_size=patch, in_channels=3,
        embed_dim=dim, pos_embed_max_size=8,
    )  # fmt: skip
    theirs = cropped.cropped_pos_embed(h * patch, w * patch)[0]  # [15, dim]
    big = sincos_grid((8, 8), dim, interpolation_scale=8 / h, dtype=F64).view(8, 8, dim)
    top, left = (8 - h) // 2, (8 - w) // 2
    ours = big[top : top + h, left : left + w].reshape(-1, dim)
    theta = torch.full_like(ours, 8.0 * h / 8)
    assert ((theirs.double() - ours).abs() <= float32_bound(theta, 1e4)).all()
    assert cropped(torch.randn(1, 3, h * patch, w * patch)).shape == (1, 15, dim)


# ----------------------------------------------------------------------------------------------------------
# DETR in transformers
# ----------------------------------------------------------------------------------------------------------


def test_transformers_detr_sine_embedding():
    detr = require("transformers.models.detr.modeling_detr")
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(3, 19, 27, dtype=torch.bool)  # True where padded
    for b in range(3):
        mask[b, : int(torch.randint(1, 20, (), generator=gen)), : 5 + 7 * b] = False
    for normalize in (True, False):
        module = detr.DetrSinePositionEmbedding(64, normalize=normalize)
        # Hugging Face's pixel_mask is 1 where the pixel is valid
        shape = (3, 256, 19, 27)
        theirs = module(shape, "cpu", torch.float32, mask=(~mask).long())
        exact = detr_position_embedding_sine(mask, 64, normalize=normalize, dtype=F64)
        ours = detr_sine_encoding(mask, 64, normalize=normalize)
        assert theirs.shape == ours.shape == (3, 128, 19, 27)
        closer = (ours.double() - exact).abs() <= (theirs.double() - exact).abs()
        assert ((ours == theirs) | closer).all()
        top = 2 * math.pi if normalize else 27.0
        bound = float32_bound(torch.full_like(exact, top), 1e4)
        assert ((theirs.double() - exact).abs() <= bound).all()


# ----------------------------------------------------------------------------------------------------------
# diffusers' grid functions replaced, with diffusers' own arguments
# ----------------------------------------------------------------------------------------------------------

DIFFUSERS_2D_CALLS = [  # (args, kwargs) as diffusers' models pass them
    ((1152, 32), {"base_size": 32}),  # DiT-XL/2 at 512: 32 x 32 patches
    (
        (288, 64),
        {"base_size": 64, "interpolation_scale": 2.0},
    ),  # PixArt-alpha 1024, fewer channels
    ((64, 96), {"base_size": 64}),  # an SD3-style table larger than its base size
    ((64, (24, 40)), {}),  # a non-square grid at diffusers' defaults (base_size 16)
    ((64, (7, 3)), {"base_size": 5, "interpolation_scale": 0.5}),
    ((64, 8), {"cls_token": True, "extra_tokens": 2}),
]


@pytest.mark.parametrize(("args", "kwargs"), DIFFUSERS_2D_CALLS)
def test_get_2d_sincos_pos_embed_is_a_drop_in(args, kwargs):
    from posenc import conventions

    theirs = embeddings.get_2d_sincos_pos_embed(*args, **kwargs)
    ours = conventions.get_2d_sincos_pos_embed(*args, **kwargs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == F64
    size = args[1] if isinstance(args[1], tuple) else (args[1], args[1])
    base, interp = kwargs.get("base_size", 16), kwargs.get("interpolation_scale", 1.0)
    theta = torch.tensor(
        base / interp
    )  # every position spans at most base_size / interpolation_scale
    assert ((ours - theirs).abs() <= float32_bound(theta, 1e4)).all()
    # posenc's values are sincos_grid's with the same keywords: no arithmetic left to the caller
    grid = sincos_grid(
        size, args[0], base_size=base, interpolation_scale=interp, dtype=F64
    )
    assert torch.equal(ours[-grid.shape[0] :], grid)
    # a table of the transposed grid is far outside the bound (the order (H, W) is diffusers')
    if size[0] != size[1]:
        other = conventions.get_2d_sincos_pos_embed(args[0], size[::-1], **kwargs)
        assert not ((other - theirs).abs() <= float32_bound(theta, 1e4)).all()


@pytest.mark.parametrize(
    "args",
    [
        (192, (45, 30), 13, 1.875, 1.0),  # CogVideoX's grid, fewer channels
        (64, (10, 6), 4),
        (32, (5, 3), 3, 0.5, 2.0),
        (48, 4, 2),
    ],
)
def test_get_3d_sincos_pos_embed_is_a_drop_in_with_width_first(args):
    from posenc import conventions

    theirs = embeddings.get_3d_sincos_pos_embed(*args)
    ours = conventions.get_3d_sincos_pos_embed(*args)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == F64
    assert ((ours - theirs).abs() <= float32_bound(torch.tensor(64.0), 1e4)).all()
    spatial = args[1] if isinstance(args[1], tuple) else (args[1], args[1])
    width, height = spatial  # diffusers reads spatial_size as (W, H)
    assert ours.shape == (args[2], height * width, args[0])
    if width != height:  # read as (H, W), the table is another grid's
        swapped = conventions.get_3d_sincos_pos_embed(args[0], spatial[::-1], *args[2:])
        assert not torch.allclose(swapped, theirs, atol=1e-3)


def _patch_table(embed, height: int, width: int) -> torch.Tensor:
    """The table a PatchEmbed adds to the patches of a ``height x width`` latent, exactly: ``[patches, dim]``
    (a zero latent and a zero bias make the patch embeddings 0, and 0 + x is x)."""
    torch.nn.init.zeros_(embed.proj.bias)
    latent = torch.zeros(1, embed.proj.in_channels, height, width)
    with torch.no_grad():
        return embed(latent)[0]


def test_patch_embed_takes_posenc_s_tables_by_one_assignment(monkeypatch):
    from posenc import conventions

    module = require(
        "diffusers.models.embeddings"
    )  # the module itself, where PatchEmbed looks the name up
    size = {
        "height": 32,
        "width": 32,
        "patch_size": 2,
        "in_channels": 4,
        "embed_dim": 64,
    }
    theirs = module.PatchEmbed(**size)
    monkeypatch.setattr(
        module, "get_2d_sincos_pos_embed", conventions.get_2d_sincos_pos_embed
    )
    ours = module.PatchEmbed(**size)
    for (height, width), grid in (((32, 32), (16, 16)), ((12, 20), (6, 10))):
        # the stored table, and the one forward makes for another grid: posenc's, rounded to float32
        exact = sincos_grid(grid, 64, base_size=16, dtype=F64)
        assert torch.equal(_patch_table(ours, height, width), exact.float())
        gap = (_patch_table(theirs, height, width).double() - exact).abs()
        assert (gap <= float32_bound(torch.tensor(16.0), 1e4)).all()
    assert (
        gap.max() > 0
    )  # at 6 x 10, diffusers' float32 positions are not exact: its table differs


def test_a_square_patch_embed_recomputes_a_right_table_for_any_grid():
    # a PatchEmbed built square (32 x 32 patches) and run on 3 x 5 patches: the table of the 3 x 5 grid
    p, dim = 8, 64
    embed = embeddings.PatchEmbed(
        height=32 * p, width=32 * p, patch_size=p, in_channels=3, embed_dim=dim
    )
    table = _patch_table(embed, 3 * p, 5 * p).double()
    assert table.shape == (15, dim)
    ours = sincos_grid((3, 5), dim, base_size=32, dtype=F64)
    assert ((table - ours).abs() <= float32_bound(torch.tensor(32.0), 1e4)).all()


def test_transformers_detr_takes_its_pixel_mask_by_name():
    detr = require("transformers.models.detr.modeling_detr")
    gen = torch.Generator().manual_seed(1)
    pixel_mask = torch.zeros(
        2, 11, 13, dtype=torch.long
    )  # Hugging Face's: 1 where the image is
    for b in range(2):
        pixel_mask[b, : int(torch.randint(2, 12, (), generator=gen)), : 4 + 6 * b] = 1
    module = detr.DetrSinePositionEmbedding(32, normalize=True)
    theirs = module((2, 64, 11, 13), "cpu", torch.float32, mask=pixel_mask)
    ours = detr_sine_encoding(pixel_mask=pixel_mask, num_pos_feats=32, normalize=True)
    bound = float32_bound(torch.full_like(ours, 2 * math.pi, dtype=F64), 1e4)
    assert ((theirs.double() - ours.double()).abs() <= bound + 2**-24).all()
    with pytest.raises(
        ValueError, match="other polarity"
    ):  # the same mask passed as DETR's
        detr_sine_encoding(pixel_mask.bool(), 32, normalize=True)
