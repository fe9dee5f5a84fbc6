"""posenc's rotary embeddings against the installed peers themselves (book/15_rotary_conventions.ipynb, and
book/14_rope_scaling.ipynb for the rope types): transformers 5.23,
diffusers 0.42.1, timm 1.0.31 (its real ``pos_embed_sincos``, via tests/references/peers.py) and
rotary-embedding-torch 0.9.1.

Not run on the torch floor (tools/floor_check.py runs tests/rotary/test_rotation.py, which needs none of these
packages). Bounds:

- frequencies: transformers' float32 ``inv_freq`` within ``hf_frequency_bound`` (tests/references/rotary_peers.py,
  derived in book/14_rope_scaling: ``(ln(base) + 6) * 2**-24`` relative, more for the blends of yarn and llama3) of
  posenc's float64 omega_i; the attention factor the same Python float;
- rotations from positions: a peer's float32 angle is off by its frequencies' relative error times ``p * omega_i``
  plus the float32 product (``2**-24 * p``) and cosine, so the outputs by ``(p * (rel + 2**-23) + 2**-22)`` per unit
  of pair norm (times the attention factor), plus both sides' float32 rotation roundings;
- given the peer's own tables, posenc's rotation is the peer's bit for bit (the same products and sum).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import RotaryEmbedding, apply_rotary, rotary_cos_sin, rotary_frequencies
from tests.references import rotary_peers as peers
from tests.references.peers import Lazy, require, timm_pos_embed_sincos

# the installed peers, imported by the first test that uses each
# (tests/references/peers.py: Lazy)
transformers = Lazy("transformers")
apply_rotary_emb = Lazy("diffusers.models.embeddings", "apply_rotary_emb")
FluxPosEmbed = Lazy("diffusers.models.transformers.transformer_flux", "FluxPosEmbed")
LucidrainsRotary = Lazy("rotary_embedding_torch", "RotaryEmbedding")
modeling_gpt_neox = Lazy("transformers.models.gpt_neox.modeling_gpt_neox")
apply_rotary_pos_emb = Lazy(
    "transformers.models.llama.modeling_llama", "apply_rotary_pos_emb"
)
modeling_phi3 = Lazy("transformers.models.phi3.modeling_phi3")
qwen2_vl = Lazy("transformers.models.qwen2_vl.modeling_qwen2_vl")


@pytest.fixture(autouse=True, scope="module")
def _quiet_transformers() -> None:
    # transformers' advice on the random configs below
    require("transformers.utils.logging").set_verbosity_error()


U32 = 2.0**-24
FLOAT32_FACTOR = 2 + 1 / math.sqrt(2)
SETTINGS = settings(max_examples=25, deadline=None, database=None)
LLAMA31 = {**peers.LLAMA31, "max_position_embeddings": 131072}


def drift(
    x: torch.Tensor,
    p_max: int,
    relative: float,
    layout: str = "half",
    rotary_dim=None,
    attention=1.0,
):
    """|posenc - peer| allowed for a float32 peer from positions (see the module docstring)."""
    norms = peers.pair_norms(x, rotary_dim, layout)
    angle = (p_max + 1) * (relative + 2 * U32) + 4 * U32
    return attention * (angle + 3 * FLOAT32_FACTOR * U32) * norms + 1e-30


def rel_error(hf_omega: torch.Tensor, omega: torch.Tensor) -> float:
    return ((hf_omega.double() - omega).abs() / omega).max().item()


# ----------------------------------------------------------------------------------------------------------
# Frequencies: ROPE_INIT_FUNCTIONS on random configs of every type
# ----------------------------------------------------------------------------------------------------------

head_dims = st.sampled_from([32, 64, 80, 96, 128])
bases = st.sampled_from([1e4, 5e5, 1e6, 123456.0])
factors = st.floats(1.0, 64.0)


@st.composite
def configs(draw) -> tuple[int, dict, int | None]:
    """(head_dim, rope_parameters with max_position_embeddings, seq_len) for a random type."""
    head_dim, base = draw(head_dims), draw(bases)
    rope_type = draw(
        st.sampled_from(["default", "linear", "dynamic", "yarn", "llama3", "longrope"])
    )
    original = draw(st.sampled_from([2048, 4096, 8192, 32768]))
    s = draw(factors)
    params: dict = {"rope_type": rope_type, "rope_theta": base}
    seq_len = None
    if rope_type in ("linear", "dynamic", "yarn", "llama3"):
        params["factor"] = s
    if rope_type == "dynamic":
        params["max_position_embeddings"] = original
        seq_len = draw(
            st.sampled_from([None, original // 2, original, 3 * original + 5])
        )
    if rope_type in ("yarn", "llama3", "longrope"):
        params["original_max_position_embeddings"] = original
        params["max_position_embeddings"] = int(original * max(s, 1.5))
    if rope_type == "yarn":
        params["beta_fast"] = draw(st.sampled_from([32, 16]))
        params["beta_slow"] = draw(st.sampled_from([1, 2]))
        if draw(st.booleans()):
            params["mscale"], params["mscale_all_dim"] = (
                1.0,
                draw(st.sampled_from([0.707, 1.0])),
            )
        params["truncate"] = draw(st.booleans())
    if rope_type == "llama3":
        low = draw(st.sampled_from([1.0, 2.0]))
        params["low_freq_factor"], params["high_freq_factor"] = (
            low,
            low + draw(st.sampled_from([1.0, 3.0])),
        )
    if rope_type == "longrope":
        n = head_dim // 2
        params["short_factor"] = [
            1.0 + 0.01 * draw(st.integers(0, 50)) for _ in range(n)
        ]
        params["long_factor"] = [1.0 + 0.5 * draw(st.integers(0, 60)) for _ in range(n)]
        seq_len = draw(st.sampled_from([None, original, original + 1]))
    # (Llama's default function ignores partial_rotary_factor; GPT-NeoX's honours it: tested below)
    if draw(st.booleans()) and rope_type not in ("longrope", "default"):
        params["partial_rotary_factor"] = 0.5
    return head_dim, params, seq_len


@SETTINGS
@given(case=configs())
def test_frequencies_agree_with_rope_init_functions(case):
    head_dim, params, seq_len = case
    ours, attention = rotary_frequencies(head_dim, scaling=params, seq_len=seq_len)
    max_pos = params.get("max_position_embeddings", 8192)
    hf_omega, hf_attention = peers.hf_inv_freq(
        head_dim, params, max_pos, seq_len=seq_len
    )
    assert hf_omega.shape == ours.shape
    assert rel_error(hf_omega, ours) <= peers.hf_frequency_bound(params), params
    assert attention == hf_attention


def test_the_frequency_bound_is_not_loose_by_orders_of_magnitude():
    # the bound is a bound, but not a vacuous one: transformers' float32 error reaches a tenth of it for llama3
    hf_omega, _ = peers.hf_inv_freq(128, LLAMA31, 131072)
    ours, _ = rotary_frequencies(128, scaling=LLAMA31)
    error = rel_error(hf_omega, ours)
    assert error > 2 * U32 and error > 0.05 * peers.hf_frequency_bound(LLAMA31)


# ----------------------------------------------------------------------------------------------------------
# Rotations against transformers' modules: every type, dynamic and longrope over sequences of calls
# ----------------------------------------------------------------------------------------------------------

TYPES = {
    "default": {"rope_type": "default", "rope_theta": 1e4},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 512},
    "yarn": {
        "rope_type": "yarn",
        "factor": 4.0,
        "rope_theta": 1e6,
        "original_max_position_embeddings": 1024,
        "max_position_embeddings": 4096,
    },
    "llama3": {
        **LLAMA31,
        "original_max_position_embeddings": 256,
        "max_position_embeddings": 2048,
    },
    "longrope": {
        "rope_type": "longrope",
        "original_max_position_embeddings": 512,
        "max_position_embeddings": 4096,
        "short_factor": [1.0 + 0.02 * i for i in range(32)],
        "long_factor": [1.0 + 0.25 * i for i in range(32)],
    },
}


@pytest.mark.parametrize("name", list(TYPES))
def test_rotation_agrees_with_transformers_module_for_every_type(name):
    params = TYPES[name]
    torch.manual_seed(40)
    q, k = torch.randn(2, 8, 48, 64), torch.randn(2, 2, 48, 64)
    module = peers.hf_rotary_embedding(
        64, params, params.get("max_position_embeddings", 8192)
    )
    rope = RotaryEmbedding(64, layout="half", scaling=params, max_len=256)
    for start in (0, 200, 1000):  # inside, then past the original lengths
        position_ids = torch.arange(start, start + 48).expand(2, -1)
        cos, sin = module(q, position_ids)
        hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
        ours = rope(q, k, positions=position_ids)
        relative = peers.hf_frequency_bound(params)
        tol = drift(q, start + 47, relative, attention=rope.attention_factor)
        assert ((ours[0] - hq).abs() <= tol).all(), (name, start)
        assert (
            (ours[1] - hk).abs()
            <= drift(k, start + 47, relative, attention=rope.attention_factor)
        ).all()
        # and transformers' rotation with posenc's tables is posenc's, bitwise
        oc, osin = rope.cos_sin(position_ids)
        assert all(
            torch.equal(a, b)
            for a, b in zip(apply_rotary_pos_emb(q, k, oc, osin), ours)
        )


@pytest.mark.parametrize("name", ["dynamic", "longrope"])
def test_frequencies_follow_transformers_over_a_sequence_of_calls(name):
    params = TYPES[name]
    max_pos = params["max_position_embeddings"]
    module = peers.hf_rotary_embedding(64, params, max_pos)
    rope = RotaryEmbedding(64, layout="half", scaling=params)
    x = torch.randn(1, 1, 1, 64)
    for length in (100, 700, 600, 900, 300, 513, 512, 5000, 100):
        position_ids = torch.arange(length)[None]
        cos, _ = module(x, position_ids)
        ours_cos, ours_sin = rope.cos_sin(position_ids)
        assert rel_error(module.inv_freq, rope.frequencies) <= peers.hf_frequency_bound(
            params
        ), length
        tol = drift(
            torch.ones(1, 64),
            length,
            peers.hf_frequency_bound(params),
            attention=rope.attention_factor,
        )
        assert ((ours_cos - cos).abs() <= tol.max()).all()
        # the module's rotation uses the same state: transformers' rotation with its tables
        q = torch.randn(1, 2, length, 64)
        assert torch.equal(
            rope.rotate(q), apply_rotary_pos_emb(q, q, ours_cos, ours_sin)[0]
        )


def test_phi3_longrope_with_partial_rotary_against_transformers():
    # Phi-3's own module: longrope factors and a partial rotary factor in the config
    config = modeling_phi3.Phi3Config(
        hidden_size=256, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192,
        original_max_position_embeddings=1024, partial_rotary_factor=0.75,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.01 * i for i in range(24)],
                      "long_factor": [1.0 + 0.3 * i for i in range(24)]},
    )  # fmt: skip
    module = modeling_phi3.Phi3RotaryEmbedding(config)
    params = copy.deepcopy(
        config.rope_parameters
    )  # as the config holds them, plus the model's length
    rope = RotaryEmbedding(
        64, layout="half", scaling={**params, "max_position_embeddings": 8192}
    )
    assert rope.rotary_dim == 48 and rope.attention_factor == module.attention_scaling
    x = torch.randn(1, 4, 16, 64)
    for start in (0, 1010, 3000):
        position_ids = torch.arange(start, start + 16)[None]
        cos, sin = module(x, position_ids)
        ours_cos, ours_sin = rope.cos_sin(position_ids)
        assert cos.shape == ours_cos.shape == (1, 16, 48)
        tol = drift(
            torch.ones(1, 48),
            start + 15,
            peers.hf_frequency_bound(params),
            attention=rope.attention_factor,
        )
        assert ((ours_cos - cos).abs() <= tol.max()).all() and (
            (ours_sin - sin).abs() <= tol.max()
        ).all()


@pytest.mark.parametrize("offset", [0, 7, 3000])
@pytest.mark.parametrize("rotary_dim", [None, 32])
def test_gpt_neox_partial_rotary_and_lucidrains_from_positions(offset, rotary_dim):
    # (moved from test_rotation.py, against the installed packages)
    torch.manual_seed(9)
    x = torch.randn(2, 4, 40, 64)
    p = torch.arange(offset, offset + 40)
    p_max = offset + 39
    hf = peers.hf_rope(x, p, rotary_dim=rotary_dim)
    ours = apply_rotary(x, offset, layout="half", rotary_dim=rotary_dim)
    relative = peers.hf_frequency_bound({})
    assert ((ours - hf).abs() <= drift(x, p_max, relative, "half", rotary_dim)).all()
    r = rotary_dim or 64
    lucidrains = LucidrainsRotary(r, cache_if_possible=False).rotate_queries_or_keys(
        x, offset=offset
    )
    ours = apply_rotary(x, offset, rotary_dim=rotary_dim)
    assert (
        (ours - lucidrains).abs()
        <= drift(x, p_max, relative, "interleaved", rotary_dim)
    ).all()


def test_gpt_neox_module_with_partial_rotary_factor():
    config = transformers.GPTNeoXConfig(
        hidden_size=256, num_attention_heads=4, rotary_pct=0.25
    )
    module = modeling_gpt_neox.GPTNeoXRotaryEmbedding(config)
    rope = RotaryEmbedding(64, layout="half", scaling=config.rope_parameters)
    assert rope.rotary_dim == 16
    q = torch.randn(1, 4, 30, 64)
    position_ids = torch.arange(500, 530)[None]
    cos, sin = module(q, position_ids)
    hq, _ = modeling_gpt_neox.apply_rotary_pos_emb(q, q, cos, sin)
    ours = rope.rotate(q, positions=position_ids)
    assert torch.equal(ours[..., 16:], q[..., 16:])
    assert (
        (ours - hq).abs() <= drift(q, 529, peers.hf_frequency_bound({}), "half", 16)
    ).all()


def test_linear_scaling_agrees_with_transformers():
    torch.manual_seed(10)
    x = torch.randn(1, 2, 30, 64)
    p = torch.arange(5000, 5030)
    linear = {"rope_type": "linear", "factor": 4.0}
    hf = peers.hf_rope(x, p, rope_parameters=linear)
    ours = apply_rotary(x, p, layout="half", scaling=linear)
    assert ((ours - hf).abs() <= drift(x, 5030, peers.hf_frequency_bound(linear))).all()


def test_hugging_face_bitwise_with_its_own_tables():
    torch.manual_seed(6)
    q, k = torch.randn(2, 8, 33, 64), torch.randn(2, 2, 33, 64)
    pos = torch.stack([torch.arange(33), torch.arange(100, 133)])
    for params in (TYPES["default"], TYPES["yarn"], LLAMA31):
        cos, sin = peers.hf_rotary_embedding(64, params, 1 << 20)(q, pos)
        hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
        assert torch.equal(apply_rotary(q, cos=cos, sin=sin, layout="half"), hq)
        assert torch.equal(apply_rotary(k, cos=cos, sin=sin, layout="half"), hk)
        # [batch, seq_len, heads, head_dim] with seq_dim=-3 is the same as transformers' unsqueeze_dim=2
        qt = q.transpose(1, 2)
        hqt, _ = apply_rotary_pos_emb(qt, qt, cos, sin, unsqueeze_dim=2)
        assert torch.equal(
            apply_rotary(qt, cos=cos, sin=sin, layout="half", seq_dim=-3), hqt
        )


def test_hugging_face_drifts_in_float32_and_posenc_does_not():
    torch.manual_seed(5)
    x = torch.randn(1, 1, 64, 128)
    for start, floor in ((65_000, 1e-3), (1_000_000, 2e-2)):
        p = torch.arange(start, start + 64)
        ref = torch.from_numpy(peers.numpy_rotation(x, p, layout="half"))
        hf = (peers.hf_rope(x, p).double() - ref).abs().max().item()
        ours = (apply_rotary(x, p, layout="half").double() - ref).abs().max().item()
        assert hf > floor and ours <= 1e-6, (start, hf, ours)
        # about half of it is transformers' float32 inv_freq (the chapter's fairness note)
        own = peers.hf_rotary_embedding(128).inv_freq.double()
        ref_own = torch.from_numpy(
            peers.numpy_rotation(x, p, layout="half", frequencies=own)
        )
        share = (peers.hf_rope(x, p).double() - ref_own).abs().max().item() / hf
        assert 0.35 < share < 0.75


def test_wrong_layout_and_broadcast_table_traps_of_transformers():
    q, k = torch.randn(2, 8, 16, 64), torch.randn(2, 2, 16, 64)
    position_ids = torch.arange(100, 116).expand(2, -1)
    rope = RotaryEmbedding(64, layout="half")
    cos, sin = rope.cos_sin(position_ids)
    hq, _ = apply_rotary_pos_emb(q, k, cos, sin)
    assert (RotaryEmbedding(64)(q, k, positions=position_ids)[0] - hq).abs().max() > 1
    x = torch.randn(1, 4, 4, 64)  # heads == seq_len
    c4, s4 = rope.cos_sin(
        4
    )  # [seq_len, head_dim]: transformers broadcasts it over the heads
    wrong, _ = apply_rotary_pos_emb(x, x, c4, s4)
    assert not torch.allclose(wrong, rope.rotate(x), atol=0.1)
    with pytest.raises(
        ValueError, match=r"cos and sin must be \[seq_len, rotary_dim\]"
    ):
        apply_rotary(x, cos=c4[:, None], sin=s4[:, None], layout="half")


# ----------------------------------------------------------------------------------------------------------
# Half precision: transformers in bfloat16, rotary-embedding-torch in bfloat16 (the chapter's numbers)
# ----------------------------------------------------------------------------------------------------------


def test_bfloat16_recipes_beside_posenc():
    torch.manual_seed(41)
    xb = torch.randn(1, 1, 64, 128).bfloat16()
    module = peers.hf_rotary_embedding(128, max_position_embeddings=1 << 21)
    errors = {}
    for start in (0, 300, 60_000, 2**20):
        p = torch.arange(start, start + 64)
        half = torch.from_numpy(peers.numpy_rotation(xb, p, layout="half"))
        inter = torch.from_numpy(peers.numpy_rotation(xb, p))
        cos, sin = module(xb, p[None])
        errors[start] = (
            (apply_rotary_pos_emb(xb, xb, cos, sin)[0].double() - half)
            .abs()
            .max()
            .item(),
            (
                LucidrainsRotary(128, cache_if_possible=False)
                .rotate_queries_or_keys(xb, offset=start)
                .double()
                - inter
            )
            .abs()
            .max()
            .item(),
            (apply_rotary(xb, p, layout="half").double() - half).abs().max().item(),
        )
    assert (
        errors[2**20][0] > 0.05
        and max(e[0] for s_, e in errors.items() if s_ < 2**20) < 0.05
    )
    assert (
        errors[0][1] < 2**-5 and min(errors[s_][1] for s_ in (300, 60_000, 2**20)) > 1
    )
    assert max(e[2] for e in errors.values()) < 2**-5


# ----------------------------------------------------------------------------------------------------------
# Several position axes: Qwen2-VL (transformers), Flux (diffusers), EVA-style grids (timm)
# ----------------------------------------------------------------------------------------------------------


def qwen2_vl_positions(
    text: int, grid: tuple[int, int], batch: int = 1
) -> torch.Tensor:
    """[3, batch, text + h * w]: text tokens 0..text-1 on all axes, then an image at time `text`."""
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    image = torch.stack(
        [torch.full((h * w,), text), text + rows.flatten(), text + cols.flatten()]
    )
    return torch.cat([torch.arange(text).expand(3, -1), image], 1)[:, None].expand(
        3, batch, -1
    )


@pytest.mark.parametrize("base", [1e4, 1e6])
def test_qwen2_vl_mrope_against_transformers(base):
    scaling = {"type": "mrope", "mrope_section": [16, 24, 24]}
    config = transformers.Qwen2VLConfig(
        text_config={"hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
                     "rope_theta": base, "rope_scaling": dict(scaling)},
    ).text_config  # fmt: skip
    module = qwen2_vl.Qwen2VLRotaryEmbedding(config)
    rope = RotaryEmbedding(128, layout="half", base=base, scaling=scaling)
    for text, grid in ((5, (4, 6)), (300, (16, 16))):
        pos = qwen2_vl_positions(text, grid, batch=2)
        n = pos.shape[-1]
        q, k = torch.randn(2, 12, n, 128), torch.randn(2, 2, n, 128)
        cos, sin = module(q, pos)
        hq, _ = qwen2_vl.apply_rotary_pos_emb(q, k, cos, sin)
        ours = rope(q, k, positions=pos)
        tol = drift(q, int(pos.max()), peers.hf_frequency_bound({"rope_theta": base}))
        assert ((ours[0] - hq).abs() <= tol).all()
        oc, osin = rope.cos_sin(pos)
        assert oc.shape == cos.shape
        assert all(
            torch.equal(a, b)
            for a, b in zip(qwen2_vl.apply_rotary_pos_emb(q, k, oc, osin), ours)
        )
        assert torch.equal(apply_rotary(q, cos=cos, sin=sin, layout="half"), hq)


def test_qwen2_vl_vision_rotary_against_transformers():
    config = qwen2_vl.Qwen2VLVisionConfig(embed_dim=320, num_heads=4)
    module = qwen2_vl.Qwen2VLVisionRotaryEmbedding(config)
    rows, cols = torch.meshgrid(torch.arange(12), torch.arange(10), indexing="ij")
    hw = torch.stack([rows.flatten(), cols.flatten()])  # [2, 120]
    q, k = torch.randn(120, 4, 80), torch.randn(120, 4, 80)  # [seq, heads, head_dim]
    cos, sin = module(q, hw.T)
    hq, _ = qwen2_vl.apply_rotary_pos_emb_vision(q, k, cos, sin)
    ours = apply_rotary(q, hw, axes_dim=[40, 40], layout="half", seq_dim=-3)
    assert (
        (ours - hq).abs() <= drift(q, 12, peers.hf_frequency_bound({}), "half")
    ).all()
    assert torch.equal(apply_rotary(q, cos=cos, sin=sin, layout="half", seq_dim=-3), hq)


def test_flux_against_diffusers():
    h, w, text = 16, 24, 7
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    image = torch.stack(
        [torch.zeros(h * w), rows.flatten().float(), cols.flatten().float()], 1
    )
    ids = torch.cat(
        [torch.zeros(text, 3), image]
    )  # [seq, 3], as FluxPipeline builds them
    pos_embed = FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])
    cos, sin = pos_embed(ids)
    ours_cos, ours_sin = rotary_cos_sin(ids.T.long(), 128, axes_dim=[16, 56, 56])
    # both float64 angles rounded once to float32: within one float32 rounding of each other
    assert (ours_cos - cos).abs().max() <= 2**-24 and (
        ours_sin - sin
    ).abs().max() <= 2**-24
    x = torch.randn(1, ids.shape[0], 4, 128)  # [batch, seq_len, heads, head_dim]
    want = apply_rotary_emb(x, (cos, sin), sequence_dim=1)
    ours = apply_rotary(x, ids.T.long(), axes_dim=[16, 56, 56], seq_dim=-3)
    assert ((ours - want).abs() <= 3 * FLOAT32_FACTOR * U32 * peers.pair_norms(x)).all()
    assert torch.equal(apply_rotary(x, cos=cos, sin=sin, seq_dim=-3), want)
    module = RotaryEmbedding(128, axes_dim=[16, 56, 56])
    assert torch.equal(module.rotate(x, positions=ids.T.long(), seq_dim=-3), ours)


@pytest.mark.parametrize("rotate_half", [False, True])
def test_timm_axial_grid_against_timm(rotate_half):
    sincos = timm_pos_embed_sincos()
    layout = "half" if rotate_half else "interleaved"
    cat = sincos.RotaryEmbeddingCat(
        64, in_pixels=False, feat_shape=[14, 14], rotate_half=rotate_half
    )
    embed = cat.get_embed()  # [196, 128]: sin | cos
    sin_t, cos_t = embed.chunk(2, -1)
    rows, cols = torch.meshgrid(torch.arange(14), torch.arange(14), indexing="ij")
    grid = torch.stack([rows.flatten(), cols.flatten()])
    if rotate_half:
        # timm's half layout is [h, w | h, w] over the head: posenc's half layout of [h bands, w bands]
        cos, sin = rotary_cos_sin(grid, 64, axes_dim=[32, 32], layout="half")
    else:
        cos, sin = rotary_cos_sin(grid, 64, axes_dim=[32, 32])
    tol = drift(torch.ones(1, 64), 14, peers.hf_frequency_bound({}), layout).max()
    assert (cos - cos_t).abs().max() <= tol and (sin - sin_t).abs().max() <= tol
    x = torch.randn(2, 3, 196, 64)
    want = sincos.apply_rot_embed_cat(x, embed, half=rotate_half)
    assert torch.equal(apply_rotary(x, cos=cos_t, sin=sin_t, layout=layout), want)
    ours = apply_rotary(x, grid, axes_dim=[32, 32], layout=layout)
    assert (
        (ours - want).abs() <= drift(x, 14, peers.hf_frequency_bound({}), layout)
    ).all()


# ----------------------------------------------------------------------------------------------------------
# rotary-embedding-torch
# ----------------------------------------------------------------------------------------------------------


def test_lucidrains_bitwise_with_its_own_tables():
    torch.manual_seed(7)
    t = torch.randn(2, 4, 20, 48)
    module = LucidrainsRotary(32, cache_if_possible=False)
    freqs = module(
        torch.arange(20.0) + 9
    )  # [seq, 32]: angles, each repeated for its pair
    expected = module.rotate_queries_or_keys(t, offset=9)
    assert torch.equal(apply_rotary(t, cos=freqs.cos(), sin=freqs.sin()), expected)
    # seq_before_head_dim: [batch, seq, heads, dim], the same as seq_dim=-3
    tt = t.transpose(1, 2)
    theirs = LucidrainsRotary(32, seq_before_head_dim=True, cache_if_possible=False)
    assert torch.equal(apply_rotary(tt, cos=freqs.cos(), sin=freqs.sin(), seq_dim=-3),
                       theirs.rotate_queries_or_keys(tt, offset=9))  # fmt: skip


def test_numpy_reference_is_independent_of_posenc():
    # the float64 reference the tests trust: NumPy's pow, sin and cos, not posenc's
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    p = torch.tensor([0, 1, 10**6])
    ref = peers.numpy_rotation(x, p)
    theta = 10**6 * 10000.0 ** (-2 * 3 / 16)
    a, b = x[0, 2, 6].item(), x[0, 2, 7].item()
    assert np.isclose(
        ref[0, 2, 6], a * math.cos(theta) - b * math.sin(theta), rtol=0, atol=1e-9
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rounding_each_is_transformers_apply_rotary_pos_emb_bitwise(dtype):
    # transformers rotates half-precision q and k in their own dtype, with the tables
    # cast to it: rounding="each" is that arithmetic, on posenc's tables
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    q, k = (torch.randn(1, 4, 17, 64).to(dtype) for _ in "qk")
    cos, sin = rotary_cos_sin(
        torch.arange(40, 57)[None], 64, layout="half", dtype=dtype
    )
    want = apply_rotary_pos_emb(q, k, cos, sin)
    got = RotaryEmbedding(64, layout="half", rounding="each")(q, k, offset=40)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # the default rounds once instead, and differs from it somewhere
    assert not torch.equal(
        RotaryEmbedding(64, layout="half")(q, k, offset=40)[0], want[0]
    )
