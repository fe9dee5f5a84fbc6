"""posenc.rotary.scaling (book/14_rope_scaling.ipynb): the parameter reading refuses nonsense at construction, and
the types added for transformers 5.23 (``proportional``, per-layer-type ``rope_parameters``, Qwen3-VL's interleaved
M-RoPE) agree with the installed transformers: frequencies within ``hf_frequency_bound``
(tests/references/rotary_peers.py), tables elementwise within one float32 rounding of the angle
error that bound allows."""

from __future__ import annotations

import copy

import pytest
import torch

from posenc import RotaryEmbedding, rotary_frequencies
from posenc.rotary.scaling import (
    _attention_factor,
    _frequencies,
    _per_axis,
    _rope_parameters,
)
from tests.references import rotary_peers as peers

LONGROPE = {
    "rope_type": "longrope",
    "original_max_position_embeddings": 64,
    "max_position_embeddings": 512,
    "short_factor": [1.0 + 0.02 * i for i in range(16)],
    "long_factor": [1.0 + 0.25 * i for i in range(16)],
}
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 1024,
}


# ------------------------------------------------------------------------------------------------------------------
# Nonsense refused where it is given, not later
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["short_factor", "long_factor"])
def test_longrope_factors_of_the_wrong_length_are_refused_at_construction(key):
    # one factor per pair: 16 for 32 rotated channels; a list of 15 used to pass until position 64 (long_factor)
    bad = {**LONGROPE, key: LONGROPE[key][:-1]}
    with pytest.raises(
        ValueError,
        match=rf"scaling\['{key}'\] must hold one factor per pair.*16.*got 15",
    ):
        RotaryEmbedding(32, layout="half", scaling=bad)
    with pytest.raises(ValueError, match=rf"scaling\['{key}'\]"):
        rotary_frequencies(32, scaling=bad)
    RotaryEmbedding(
        32, layout="half", scaling=LONGROPE
    )  # the right length still builds


@pytest.mark.parametrize("seq_len", [-5, 0])
def test_rotary_frequencies_refuses_a_sequence_length_below_one(seq_len):
    with pytest.raises(
        ValueError, match=r"seq_len must be a positive int .*got " + str(seq_len)
    ):
        rotary_frequencies(64, scaling={"rope_type": "dynamic", "factor": 2.0,
                                        "max_position_embeddings": 512}, seq_len=seq_len)  # fmt: skip
    assert rotary_frequencies(64, seq_len=1)[0].shape == (32,)


@pytest.mark.parametrize("rope_type", ["yarn", "longrope"])
def test_an_attention_factor_of_zero_is_refused(rope_type):
    # it multiplies cos and sin: 0 would zero every query and key
    scaling = {**(YARN if rope_type == "yarn" else LONGROPE), "attention_factor": 0.0}
    with pytest.raises(
        ValueError,
        match=r"scaling\['attention_factor'\] must be a finite number > 0, got 0.0",
    ):
        rotary_frequencies(32, scaling=scaling)
    assert (
        rotary_frequencies(32, scaling={**scaling, "attention_factor": 0.5})[1] == 0.5
    )


def test_yarn_beta_fast_below_beta_slow_is_refused():
    # transformers only warns, then reverses the ramp: the fastest pair would be divided by the factor
    with pytest.raises(
        ValueError, match=r"beta_fast.*must be >= .*beta_slow.*got 1.0 and 32.0"
    ):
        rotary_frequencies(64, scaling={**YARN, "beta_fast": 1.0, "beta_slow": 32.0})
    omega, _ = rotary_frequencies(
        64, scaling={**YARN, "beta_fast": 32.0, "beta_slow": 1.0}
    )
    assert omega[0] == 1.0  # the fastest pair is kept


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_a_plain_dict_without_the_model_length_says_what_to_add(rope_type):
    scaling = (
        {"rope_type": "dynamic", "factor": 2.0}
        if rope_type == "dynamic"
        else {k: v for k, v in LONGROPE.items() if k != "max_position_embeddings"}
    )
    with pytest.raises(ValueError) as error:
        RotaryEmbedding(32, layout="half", scaling=scaling)
    message = str(error.value)
    assert "'max_position_embeddings': config.max_position_embeddings" in message
    assert "RotaryEmbedding.from_hf_config(config)" in message


# ------------------------------------------------------------------------------------------------------------------
# proportional, per-layer-type parameters, interleaved M-RoPE: against transformers 5.23
# ------------------------------------------------------------------------------------------------------------------


def _gemma4_config():
    import transformers

    return transformers.Gemma4TextConfig(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, global_head_dim=64, vocab_size=64,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512,
    )  # fmt: skip


def test_proportional_agrees_with_transformers_and_leaves_the_last_pairs_still():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = _gemma4_config()
    params = copy.deepcopy(config.rope_parameters["full_attention"])
    assert (
        params["rope_type"] == "proportional"
    )  # Gemma 4's default for its full-attention layers
    hf, hf_attention = ROPE_INIT_FUNCTIONS["proportional"](
        config.per_layer_config["full_attention"], "cpu", layer_type="full_attention"
    )
    ours, attention = rotary_frequencies(64, scaling=params)
    assert ours.shape == hf.shape == (32,) and attention == hf_attention == 1.0
    rotated = int(params["partial_rotary_factor"] * 64 // 2)  # 8 of 32 pairs turn
    assert rotated == 8 and (ours[rotated:] == 0).all() and (hf[rotated:] == 0).all()
    # the turning pairs: base^(-2i / head_dim), not base^(-2i / rotated channels)
    expected = params["rope_theta"] ** (
        -2.0 * torch.arange(rotated, dtype=torch.float64) / 64
    )
    assert torch.equal(ours[:rotated], expected)
    relative = ((hf[:rotated].double() - ours[:rotated]).abs() / ours[:rotated]).max()
    assert relative <= peers.hf_frequency_bound(params)
    # a factor divides every speed, as transformers does
    scaled, _ = rotary_frequencies(64, scaling={**params, "factor": 2.0})
    assert torch.equal(scaled, ours / 2)


def test_proportional_rotates_the_whole_head_with_still_pairs():
    params = {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1e6,
    }
    rope = RotaryEmbedding(64, layout="half", scaling=params)
    assert (
        rope.rotary_dim == 64
    )  # the tables span the head; the still pairs are the identity
    q = torch.randn(1, 2, 5, 64, dtype=torch.float64)
    out = rope.rotate(q, offset=100)
    still = torch.cat([torch.arange(8, 32), torch.arange(40, 64)])
    assert torch.equal(out[..., still], q[..., still])
    assert not torch.allclose(out[..., :8], q[..., :8])


def test_per_layer_type_parameters_select_by_layer_type():
    config = _gemma4_config()
    nested = copy.deepcopy(config.rope_parameters)
    sliding, _ = rotary_frequencies(32, scaling=nested, layer_type="sliding_attention")
    assert torch.equal(
        sliding, rotary_frequencies(32, scaling=nested["sliding_attention"])[0]
    )
    full, _ = rotary_frequencies(64, scaling=nested, layer_type="full_attention")
    assert (full[8:] == 0).all()
    with pytest.raises(
        ValueError,
        match=r"per layer type.*'full_attention', 'sliding_attention'.*layer_type=",
    ):
        rotary_frequencies(32, scaling=nested)
    with pytest.raises(
        ValueError, match=r"layer_type='chunked_attention' is not one of"
    ):
        rotary_frequencies(32, scaling=nested, layer_type="chunked_attention")
    with pytest.raises(
        ValueError,
        match=r"layer_type='full_attention' was given, but scaling is not keyed",
    ):
        rotary_frequencies(
            32, scaling=nested["full_attention"], layer_type="full_attention"
        )


def test_gemma3_per_layer_bases_against_transformers():
    import transformers
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    config = transformers.Gemma3TextConfig(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    module = Gemma3RotaryEmbedding(config)
    for layer_type in ("sliding_attention", "full_attention"):
        ours, _ = rotary_frequencies(
            32, scaling=config.rope_parameters, layer_type=layer_type
        )
        hf = getattr(module, f"{layer_type}_inv_freq")
        params = config.rope_parameters[layer_type]
        assert ((hf.double() - ours).abs() / ours).max() <= peers.hf_frequency_bound(
            params
        )
    # the two types really differ (bases 1e4 and 1e6)
    assert (
        module.sliding_attention_inv_freq[-1] > 10 * module.full_attention_inv_freq[-1]
    )


def test_qwen3_vl_interleaved_mrope_tables_against_transformers():
    import transformers
    from transformers.models.qwen3_vl.modeling_qwen3_vl import (
        Qwen3VLTextRotaryEmbedding,
    )

    sections = [
        4,
        6,
        6,
    ]  # 16 pairs: h on 1, 4, ..., 13, w on 2, 5, ..., 14, t on the rest
    config = transformers.Qwen3VLTextConfig(
        hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": sections,
                         "mrope_interleaved": True},
    )  # fmt: skip
    module = Qwen3VLTextRotaryEmbedding(config)
    scaling = copy.deepcopy(config.rope_parameters)
    rope = RotaryEmbedding(32, layout="half", scaling=scaling)
    t = torch.tensor([5, 5, 5, 5, 5, 5, 9])
    h = torch.tensor([5, 6, 6, 7, 7, 8, 9])
    w = torch.tensor([5, 6, 7, 6, 7, 6, 9])
    position_ids = torch.stack([t, h, w])[
        :, None
    ]  # [3, batch, seq]: text, a 2 x 3 image grid, text
    cos, sin = module(torch.zeros(1), position_ids)
    ours_cos, ours_sin = rope.cos_sin(position_ids)
    bound = 2**-24 + 10 * peers.hf_frequency_bound(scaling)  # angles <= 10 radians here
    assert (ours_cos - cos).abs().max() <= bound and (
        ours_sin - sin
    ).abs().max() <= bound
    # the same sections, not interleaved (Qwen2-VL's split), give other tables for the image tokens
    split = RotaryEmbedding(
        32, layout="half", scaling={**scaling, "mrope_interleaved": False}
    )
    assert (split.cos_sin(position_ids)[0] - cos).abs().max() > 0.1


def test_interleaved_per_axis_rows():
    omega = torch.arange(1, 17, dtype=torch.float64)
    rows = _per_axis(omega, [4, 6, 6], interleaved=True)
    assert rows.shape == (3, 16) and torch.equal(rows.sum(0), omega)
    # 3 * 6 = 18 > 16 pairs: five of each spatial axis fit, as in transformers' module
    assert rows[1].nonzero().flatten().tolist() == [1, 4, 7, 10, 13]
    assert rows[2].nonzero().flatten().tolist() == [2, 5, 8, 11, 14]
    with pytest.raises(TypeError, match=r"mrope_interleaved.*got .yes."):
        _rope_parameters({"mrope_interleaved": "yes"}, None)


def test_dynamic_frequencies_from_a_tensor_length_match_the_int_path():
    params = _rope_parameters(
        {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 256}, None
    )
    for n in (1, 256, 257, 1000):
        from_int = _frequencies(64, params, n)
        from_tensor = _frequencies(64, params, torch.tensor(n))
        assert torch.allclose(from_tensor, from_int, rtol=4e-16, atol=0)


def test_the_attention_factor_chapter_13_quotes():
    # book/14_rope_scaling.ipynb, claim: "an attention factor, 1.1386 for YaRN at s = 4"; LongRoPE's is above 1 too
    assert round(_attention_factor({"rope_type": "yarn", "factor": 4.0}), 4) == 1.1386
    longrope = {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
    }
    assert _attention_factor(longrope) > 1
    assert _attention_factor({"rope_type": "linear", "factor": 4.0}) == 1.0


def test_an_odd_partial_rotary_width_is_transformers_own() -> None:
    # transformers: dim = int(head_dim * partial_rotary_factor); inv_freq = 1 / base^(arange(0, dim, 2) / dim), so an
    # odd dim turns ceil(dim / 2) pairs (dim + 1 channels) at base^(-2i/dim) (Moonshine's tiny head: 8 * 0.9 = 7)
    import posenc

    rope = posenc.RotaryEmbedding(
        8, scaling={"rope_type": "default", "partial_rotary_factor": 0.9}
    )
    want = 1.0 / 1e4 ** (torch.arange(0, 7, 2, dtype=torch.float64) / 7)
    assert rope.rotary_dim == 8
    assert torch.allclose(rope.frequencies, want, rtol=1e-15, atol=0)
    with pytest.raises(
        ValueError,
        match=r"= 7 must be a positive number of channels, even for rope_type 'yarn'",
    ):
        posenc.RotaryEmbedding(
            8,
            scaling={
                "rope_type": "yarn",
                "factor": 2.0,
                "partial_rotary_factor": 0.9,
                "original_max_position_embeddings": 16,
            },
        )
