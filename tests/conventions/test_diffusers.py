"""posenc.conventions.diffusers (book/20_diffusion_rotary.ipynb) against the installed diffusers 0.42.1 and
timm 1.0.31: each rotary module posenc replaces gives, on a tiny random model, the same tables and outputs within
float32 rounding. Both sides are compared with a float64 evaluation of the library's own formula: posenc, which
forms the angles in float64 and rounds once, is within 2^-24 of it; a library that forms them in float32
(HunyuanVideo, CogVideoX, timm) within the bound ``float32_bound`` derives. The formula, the families and what is
measured are in tests/references/diffusers_families.py (``FAMILIES``, which the chapter's table is generated from).
"""

from __future__ import annotations

import pytest
import torch

from posenc.conventions import diffusers as pd
from tests.references.diffusers_families import (
    FAMILIES,
    ROUNDED_ONCE,
    Family,
    measured,
    timm_models,
)

pytestmark = pytest.mark.peers


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_each_family_matches_the_installed_library(family: Family) -> None:
    gaps = measured(family)
    assert gaps["posenc"] <= ROUNDED_ONCE  # float64 rounded once
    assert gaps["library"] <= gaps["library bound"]
    assert gaps["model"] <= 1e-6  # the tiny model's output, or the table's layout
    assert gaps["control"] > 1e-4  # a doubled base is caught
    if (
        not family.library_float32
    ):  # the library rounds float64 once as well: the same tables but last bits
        assert gaps["library"] <= ROUNDED_ONCE


def _tiny(cls_name: str, **config: object) -> torch.nn.Module:
    import diffusers

    return getattr(diffusers, cls_name)(**config)


REFUSED = {
    "LTXVideoTransformer3DModel": dict(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        num_layers=1,
        caption_channels=8,
    ),
    "MochiTransformer3DModel": dict(
        patch_size=2,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=1,
        pooled_projection_dim=8,
        in_channels=4,
        text_embed_dim=8,
        time_embed_dim=4,
        activation_fn="swiglu",
        max_sequence_length=8,
    ),
    "Lumina2Transformer2DModel": dict(
        sample_size=4,
        patch_size=2,
        in_channels=4,
        hidden_size=16,
        num_layers=1,
        num_refiner_layers=1,
        num_attention_heads=2,
        num_kv_heads=2,
        multiple_of=16,
        ffn_dim_multiplier=None,
        norm_eps=1e-5,
        scaling_factor=1.0,
        axes_dim_rope=(4, 2, 2),
        axes_lens=(32, 32, 32),
        cap_feat_dim=8,
    ),
    "QwenImageTransformer2DModel": dict(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=16,
        axes_dims_rope=(8, 4, 4),
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_rotary_module_posenc_cannot_express_is_refused_and_nothing_changes(
    name: str,
) -> None:
    model = _tiny(name, **REFUSED[name])
    before = dict(model.named_modules())
    with pytest.raises(
        ValueError, match=r"cannot be replaced by posenc: .*; nothing was replaced"
    ):
        pd.swap_rotary_diffusers(model)
    assert dict(model.named_modules()) == before


def test_cogvideox_transformer_points_to_the_function() -> None:
    model = _tiny(
        "CogVideoXTransformer3DModel", num_attention_heads=2, attention_head_dim=8, in_channels=4,
        out_channels=4, time_embed_dim=4, text_embed_dim=8, num_layers=1, sample_width=8, sample_height=8,
        sample_frames=5, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=8,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"get_3d_rotary_pos_embed"):
        pd.swap_rotary_diffusers(model)


def test_bad_arguments_name_the_argument_and_a_fix() -> None:
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    flux = pd.FluxPosEmbed(10000, [4, 6, 6])
    with pytest.raises(
        ValueError, match=r"ids must hold whole numbers >= 0 .* from 0.0 to 0.5"
    ):
        flux(torch.tensor([[0.0, 0.5, 0.0]]))
    with pytest.raises(
        ValueError, match=r"ids must be \[seq_len, 3\], got shape \(4, 2\)"
    ):
        flux(torch.zeros(4, 2))
    with pytest.raises(TypeError, match=r"transformer must be a torch.nn.Module"):
        pd.swap_rotary_diffusers("flux")
    with pytest.raises(ValueError, match=r"crops_coords=.* give fractional positions"):
        pd.get_3d_rotary_pos_embed(64, ((0, 0), (5, 8)), (4, 6), 3)
    with pytest.raises(
        ValueError, match=r"theta=10000"
    ):  # Wan's module keeps no theta: its table is read
        pd.swap_rotary_diffusers(
            torch.nn.Sequential(WanRotaryPosEmbed(12, (1, 2, 2), 32, theta=500.0))
        )
    with pytest.raises(ValueError, match=r"gives fractional positions"):
        pd.RotaryEmbeddingCat(16, feat_shape=[3, 6], ref_feat_shape=[8, 12]).get_embed()
    with pytest.raises(ValueError, match=r"grid_offset must be a whole number"):
        pd.RotaryEmbeddingCat(16, grid_offset=0.5)


def test_timm_rotary_kinds_posenc_cannot_express_are_refused() -> None:
    timm_models()
    from timm.layers import pos_embed_sincos as timm_rope

    for module, why in [
        (
            timm_rope.RotaryEmbeddingCat(16, in_pixels=True, feat_shape=[4, 4]),
            "pixel bands",
        ),
        (
            timm_rope.RotaryEmbeddingDinoV3(16, feat_shape=[4, 4]),
            "not RotaryEmbeddingCat",
        ),
    ]:
        model = torch.nn.Sequential(module)
        with pytest.raises(ValueError, match=why):
            pd.swap_rotary_timm(model)
        assert model[0] is module
