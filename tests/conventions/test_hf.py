"""posenc.HFRotaryEmbedding swapped into tiny random models of 28 transformers 5.23 families (29 models: Llama with
and without Llama 3.1's scaling), and RotaryEmbedding.from_hf_config's layout table (book/16_hugging_face.ipynb).

The swap is the one line ``model.model.rotary_emb = posenc.HFRotaryEmbedding(model.config)``. Its bound: the logits
may differ from the model's own by at most ``RELATIVE * max(1, max |logit|)`` with ``RELATIVE = 1e-4``. Why that
is float32 noise: transformers rounds its angles p·ω_i in float32 (book/14_rope_scaling bounds its frequencies to
``(ln base + 6 + K) * 2**-24`` relative, so the angles to that times p), posenc's tables are within 2^-24 of the
exact values; through these two-layer models that moved the logits by at most 1.2e-6 relative (measured over the
29 models, gpt-oss's the largest), about 80 times below the bound. Each family has two controls that must FAIL the
same comparison by 30 times the bound: the swap with its tables in the other channel order (halves <->
interleaved), and the swap built from a config whose base is doubled (the smallest measured effect, Llama 3.1's
scaling and StableLM's 4 rotated channels, is 0.008 relative, 80 times the bound). Greedy generation with the KV
cache (4 new tokens) must give the same tokens, and each step's logits the same bound.
"""

from __future__ import annotations

import copy
import pickle
import threading
import warnings

import pytest
import torch

import posenc
from posenc import HFRotaryEmbedding, RotaryEmbedding
from tests.census.compare import layers_that_rotate
from tests.references import hf_families as F
from tests.references.host_syncs import DEVICE, host_syncs

RELATIVE = 1e-4
IDS = [f"{f.name}-{f.covers.split(' ')[0].strip(',')}" for f in F.FAMILIES]


@pytest.fixture(autouse=True, scope="module")
def _quiet_transformers():
    # transformers' advice on the tiny configs (e.g. yarn's implicit factor)
    pytest.importorskip("transformers").utils.logging.set_verbosity_error()


def bound(logits: torch.Tensor) -> float:
    return RELATIVE * max(1.0, logits.abs().max().item())


class OtherChannelOrder(torch.nn.Module):
    """A control: the right tables, with their channels in the other order (halves <-> interleaved)."""

    def __init__(self, right: HFRotaryEmbedding) -> None:
        super().__init__()
        self.right = right

    def forward(self, x, position_ids, layer_type=None):
        args = (
            (x, position_ids) if layer_type is None else (x, position_ids, layer_type)
        )
        out = self.right(*args)
        flip = lambda t: torch.stack(t.chunk(2, -1), -1).flatten(-2)  # noqa: E731
        return flip(out) if isinstance(out, torch.Tensor) else tuple(map(flip, out))


def doubled_base(config):
    """A copy of ``config`` whose rope_theta is doubled (in every layer type's parameters)."""
    wrong = copy.deepcopy(config)
    text = wrong.get_text_config(decoder=True)
    params = text.rope_parameters
    for p in (
        params.values()
        if all(isinstance(v, dict) for v in params.values())
        else [params]
    ):
        p["rope_theta"] = 2 * p["rope_theta"]
    return wrong


def swapped(model, family, rotary, call):
    """``call()`` with ``rotary`` swapped in (None: the model's own), the model's own restored after."""
    own = F.rotary_of(model, family)
    if rotary is not None:
        F.set_rotary(model, family, rotary)
    try:
        with torch.no_grad():
            return call()
    finally:
        F.set_rotary(model, family, own)


@pytest.mark.parametrize("index", range(len(F.FAMILIES)), ids=IDS)
def test_swap_keeps_logits_and_greedy_generation(index):
    family = F.FAMILIES[index]
    model, inputs = F.tiny_model(index), F.prompt(family)
    logits_of = lambda: model(**inputs).logits  # noqa: E731
    generation = lambda: F.greedy(model, inputs)  # noqa: E731
    ref_logits = swapped(model, family, None, logits_of)
    ref_tokens, ref_steps = swapped(model, family, None, generation)
    ours = HFRotaryEmbedding(model.config)  # the module of the one-line swap
    logits = swapped(model, family, ours, logits_of)
    tokens, steps = swapped(model, family, ours, generation)
    tol = bound(ref_logits)
    assert (logits - ref_logits).abs().max() <= tol
    assert torch.equal(tokens, ref_tokens)
    assert all((a - b).abs().max() <= bound(b) for a, b in zip(steps, ref_steps))
    # the controls fail the same comparison, by far
    for control in (
        OtherChannelOrder(ours),
        HFRotaryEmbedding(doubled_base(model.config)),
    ):
        wrong = swapped(model, family, control, logits_of)
        assert (wrong - ref_logits).abs().max() > 30 * tol, type(control).__name__


# ----------------------------------------------------------------------------------------------------------
# RotaryEmbedding.from_hf_config: the layout table, checked against each family's own attention code
# ----------------------------------------------------------------------------------------------------------

#: The pairs of q/k channels each family rotates, from reading its modeling code in transformers 5.23: rotate_half
#: on the halves (i, i + r/2), or on neighbours (2i, 2i+1) (Cohere's and GLM's rotate_half, ERNIE 4.5's, DeepSeek's
#: apply_rotary_pos_emb_interleave, DeepSeek-V2's complex view of (2i, 2i+1)).
LAYOUTS = {
    "llama": "half", "mistral": "half", "qwen2": "half", "qwen3": "half", "phi3": "half",
    "gemma4": "half", "gemma3": "half", "olmo3": "half", "gpt_neox": "half", "phi": "half",
    "stablelm": "half", "persimmon": "half", "nemotron": "half", "cohere": "interleaved",
    "cohere2": "interleaved", "glm": "interleaved", "glm4": "interleaved", "helium": "interleaved",
    "ernie4_5": "interleaved", "deepseek_v3": "interleaved", "deepseek_v2": "interleaved",
    "gpt_oss": "half", "olmo2": "half", "granite": "half", "starcoder2": "half", "qwen2_vl": "half",
    "qwen2_5_vl": "half", "qwen3_vl": "half",
}  # fmt: skip
#: Families whose attention slices the rotated channels off before rotating them (x[..., : rotary_ndims]).
SLICED = {"phi", "stablelm", "persimmon"}


def hf_rotate(index, q, k, position_ids, layer_type):
    """The family's own path: its model's rotary module, then the function its attention calls (named here from
    reading the code, independently of posenc's reading)."""
    import importlib

    family = F.FAMILIES[index]
    model = F.tiny_model(index)
    config = model.config.get_text_config(decoder=True)
    module = importlib.import_module(
        f"transformers.models.{family.name}.modeling_{family.name}"
    )
    rotary = F.rotary_of(model, family)
    args = (q, position_ids) if layer_type is None else (q, position_ids, layer_type)
    tables = rotary(*args)
    if family.name == "deepseek_v2":
        return module.apply_rotary_emb(q, k, tables)
    if family.name == "deepseek_v3":
        assert config.rope_interleave
        return module.apply_rotary_pos_emb_interleave(q, k, *tables)
    if family.name in ("gemma4",):
        return module.apply_rotary_pos_emb(q, *tables), module.apply_rotary_pos_emb(
            k, *tables
        )
    if family.name in SLICED:
        r = tables[0].shape[-1]
        q_rot, k_rot = module.apply_rotary_pos_emb(q[..., :r], k[..., :r], *tables)
        return torch.cat([q_rot, q[..., r:]], -1), torch.cat([k_rot, k[..., r:]], -1)
    return module.apply_rotary_pos_emb(q, k, *tables)


def layer_types(config):
    return HFRotaryEmbedding(config).layer_types


def test_every_family_of_the_table_is_tested():
    assert {f.name for f in F.FAMILIES} == set(LAYOUTS)
    assert (
        len(LAYOUTS) == 28 and len(F.FAMILIES) == 29
    )  # the numbers book/15 and this file state


@pytest.mark.parametrize("index", range(len(F.FAMILIES)), ids=IDS)
def test_from_hf_config_layout_and_scores_match_the_family_code(index):
    family = F.FAMILIES[index]
    config = F.tiny_config(family)
    for layer_type in layer_types(config):
        rope = RotaryEmbedding.from_hf_config(config, layer_type=layer_type)
        assert rope.layout == LAYOUTS[family.name], layer_type
        torch.manual_seed(index)
        q, k = torch.randn(2, 4, 9, rope.head_dim), torch.randn(2, 4, 9, rope.head_dim)
        text = torch.arange(9).expand(2, -1) + 5
        if family.vision is not None:
            # an image grid of 2 x 3 after 3 text tokens: the axes differ
            grid = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10, 11], [3, 4, 4, 4, 5, 5, 5, 6, 7],
                                 [3, 4, 5, 6, 4, 5, 6, 6, 7]])  # fmt: skip
            position_ids = grid[:, None].expand(3, 2, -1)
        else:
            position_ids = text
        with torch.no_grad():
            theirs = hf_rotate(index, q, k, position_ids, layer_type)
        ours = rope(q, k, positions=position_ids)
        # scores: the same for any order of the output channels
        scores = [a @ b.transpose(-1, -2) for a, b in (theirs, ours)]
        assert (scores[0] - scores[1]).abs().max() <= 1e-4 * scores[0].abs().max(), (
            layer_type
        )
        # the other layout gives other scores: rotating q and k with their channels reordered (halves <->
        # neighbours) is the other layout's rotation, up to an order of the output channels
        r = rope.rotary_dim
        order = torch.cat(
            [
                torch.arange(0, r, 2),
                torch.arange(1, r, 2),
                torch.arange(r, rope.head_dim),
            ]
        )
        wrong = rope(q[..., order], k[..., order], positions=position_ids)
        assert (
            wrong[0] @ wrong[1].transpose(-1, -2) - scores[0]
        ).abs().max() > 1e-2 * scores[0].abs().max()


def test_rope_interleave_false_gives_the_half_layout():
    family = next(f for f in F.FAMILIES if f.name == "deepseek_v3")
    config = F.tiny_config(family)
    assert RotaryEmbedding.from_hf_config(config).layout == "interleaved"
    config.rope_interleave = False
    assert RotaryEmbedding.from_hf_config(config).layout == "half"


# ----------------------------------------------------------------------------------------------------------
# The module itself: no state in checkpoints, no host syncs, threads, compile, dynamic and longrope over calls
# ----------------------------------------------------------------------------------------------------------


def family_index(name: str, covers: str = "") -> int:
    return next(
        i
        for i, f in enumerate(F.FAMILIES)
        if f.name == name and f.covers.startswith(covers)
    )


def test_nothing_in_checkpoints_and_model_to_keeps_float64():
    index = family_index("phi3")
    model, family = F.tiny_model(index), F.FAMILIES[index]
    keys = set(model.state_dict())
    ours = HFRotaryEmbedding(model.config)
    assert (
        ours.state_dict() == {}
        and list(ours.buffers()) == []
        and list(ours.parameters()) == []
    )
    swapped(
        model,
        family,
        ours,
        lambda: (set(model.state_dict()) == keys) or pytest.fail("keys changed"),
    )
    ours.to(torch.bfloat16)  # the model's dtype: the frequencies stay float64
    assert all(rows.dtype == torch.float64 for rows in ours._omega.values())
    cos, _ = ours(torch.zeros(1, dtype=torch.bfloat16), torch.arange(5)[None])
    assert cos.dtype == torch.bfloat16
    # a deep copy (of a model) and a pickle work, and compute the same tables
    for copied in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert torch.equal(
            copied(torch.zeros(1), torch.arange(40)[None])[0],
            ours(torch.zeros(1), torch.arange(40)[None])[0],
        )


def test_tables_follow_the_input_dtype_rounded_once():
    index = family_index("llama", "default")
    model = F.tiny_model(index)
    ours = HFRotaryEmbedding(model.config)
    ids = torch.arange(0, 4000, 37)[None]
    exact, _ = ours(torch.zeros(1, dtype=torch.float64), ids)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        cos, sin = ours(torch.zeros(1, dtype=dtype), ids)
        assert cos.dtype == sin.dtype == dtype
        # round to nearest, once: no value closer in that dtype
        up = torch.nextafter(cos, torch.full_like(cos, 2)).double()
        down = torch.nextafter(cos, torch.full_like(cos, -2)).double()
        d = (cos.double() - exact).abs()
        assert (d <= (up - exact).abs()).all() and (d <= (down - exact).abs()).all()
    # families whose module keeps float32 (OLMo 2, ERNIE 4.5): float32 for a bfloat16 model too
    olmo = HFRotaryEmbedding(F.tiny_model(family_index("olmo2")).config)
    assert olmo(torch.zeros(1, dtype=torch.bfloat16), ids)[0].dtype == torch.float32


@pytest.mark.parametrize(
    "name", ["llama", "phi3", "qwen3", "qwen2_vl", "gemma4", "deepseek_v2"],
    ids=["default", "longrope", "dynamic", "mrope", "per-layer", "complex"],
)  # fmt: skip
def test_no_host_syncs_on_an_accelerator(name):
    # fake tensors on a non-CPU device (tests/references/host_syncs.py): any read of a
    # value back to the host is reported
    index = family_index(name)
    config = F.tiny_model(index).config
    # a fresh module: its frequencies move to the fake device
    ours = HFRotaryEmbedding(config)
    layer_type = ours.layer_types[-1]
    axes = 3 if name == "qwen2_vl" else 1
    shape = (axes, 2, 24) if axes > 1 else (2, 24)
    # (the first call moves the frequencies, the second runs as every later call)
    syncs = host_syncs(
        lambda x, p: (ours(x, p, layer_type), ours(x, p, layer_type)),
        lambda: torch.zeros(1, device=DEVICE),
        lambda: torch.arange(24, device=DEVICE).expand(*shape).contiguous(),
    )
    assert syncs == []


def test_the_host_sync_check_can_fail():
    # transformers' own dynamic module reads the sequence length on the host (`if seq_len > ...`)
    module = F.rotary_of(
        F.tiny_model(family_index("qwen3")), F.FAMILIES[family_index("qwen3")]
    )
    fresh = type(module)(config=module.config)
    syncs = host_syncs(
        lambda x, p: fresh(x, p),
        lambda: torch.zeros(1, device=DEVICE),
        lambda: torch.arange(24, device=DEVICE)[None],
    )
    assert syncs


def test_static_types_are_thread_safe():
    ours = HFRotaryEmbedding(F.tiny_model(family_index("qwen2_vl")).config)
    calls = [torch.arange(s, s + 30).expand(3, 2, -1) for s in range(0, 400, 50)]
    serial = [ours(torch.zeros(1), p) for p in calls]
    results = [None] * len(calls)

    def work(i):
        for _ in range(20):
            results[i] = ours(torch.zeros(1), calls[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for a, b in zip(results, serial)
    )


def test_dynamic_follows_transformers_over_a_sequence_of_calls():
    index = family_index("qwen3")  # dynamic NTK, max_position_embeddings 16
    model = F.tiny_model(index)
    theirs = type(F.rotary_of(model, F.FAMILIES[index]))(config=model.config)
    ours = HFRotaryEmbedding(model.config)
    plain = copy.deepcopy(model.config)
    plain.rope_parameters = {"rope_type": "default", "rope_theta": 1e4}
    plain = HFRotaryEmbedding(plain)  # a control: the same frequencies, never adapted
    for length in (10, 40, 30, 60, 12, 16, 17, 8):
        ids = torch.arange(length)[None]
        cos, sin = theirs(torch.zeros(1), ids)
        ours_cos, ours_sin = ours(torch.zeros(1), ids)
        # float32 angles below 60 radians: within 2**-16
        assert (ours_cos - cos).abs().max() <= 2**-16, length
        assert (ours_sin - sin).abs().max() <= 2**-16, length
        assert int(ours._kept[None]) == max(theirs.max_seq_len_cached, 16)
        grown = theirs.max_seq_len_cached > 16
        assert ((plain(torch.zeros(1), ids)[0] - cos).abs().max() > 1e-2) == grown


def test_longrope_switches_past_the_original_length_as_transformers():
    index = family_index("phi3")  # original_max_position_embeddings 14
    model = F.tiny_model(index)
    theirs = F.rotary_of(model, F.FAMILIES[index])
    ours = HFRotaryEmbedding(model.config)
    for length in (10, 14, 15, 40, 10):
        ids = torch.arange(length)[None]
        cos, _ = theirs(torch.zeros(1), ids)
        ours_cos, _ = ours(torch.zeros(1), ids)
        assert (ours_cos - cos).abs().max() <= 2**-16, length
    short, long = (
        ours(torch.zeros(1), torch.arange(14)[None])[0],
        ours(torch.zeros(1), torch.arange(15)[None])[0],
    )
    assert (short - long[:, :14]).abs().max() > 1e-3  # the long factors really differ


def test_longrope_compiles_with_fullgraph_and_switches_without_recompiling():
    # dynamo traces the whole forward as one graph (fullgraph=True: a graph break raises); the aot_eager backend
    # runs that graph with eager kernels, so the test costs a trace, not inductor's code generation
    ours = HFRotaryEmbedding(F.tiny_model(family_index("phi3")).config)
    compiled = torch.compile(ours, fullgraph=True, dynamic=False, backend="aot_eager")
    x = torch.zeros(1)
    # largest position 13: the short factors; 15: past the original length 14, the long
    short, long = torch.arange(16).clamp(max=13)[None], torch.arange(16)[None]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for ids in (short, long, short):
            got, want = compiled(x, ids), ours(x, ids)
            assert all(torch.equal(a, b) for a, b in zip(got, want))


# ----------------------------------------------------------------------------------------------------------
# Errors that name the argument and the fix
# ----------------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    config = F.tiny_model(family_index("llama")).config
    ours = HFRotaryEmbedding(config)
    with pytest.raises(TypeError, match=r"config must be a transformers model config"):
        HFRotaryEmbedding({"rope_theta": 1e4})
    with pytest.raises(TypeError, match=r"position_ids must be an integer tensor"):
        ours(torch.zeros(1), torch.ones(1, 4, dtype=torch.bool))
    # float positions, as transformers' own module takes them (Qwen3-Omni's thinker counts in float): whole
    # numbers give the integer positions' tables, anything else is refused
    floats, ints = (
        ours(torch.zeros(1), torch.arange(4.0)[None]),
        ours(torch.zeros(1), torch.arange(4)[None]),
    )
    assert all(torch.equal(a, b) for a, b in zip(floats, ints))
    with pytest.raises(
        ValueError, match=r"position_ids must hold whole numbers .*\[0.5\]"
    ):
        ours(torch.zeros(1), torch.tensor([[0.0, 0.5]]))
    with pytest.raises(TypeError, match=r"x must be a floating tensor"):
        ours(torch.zeros(1, dtype=torch.long), torch.arange(4)[None])
    with pytest.raises(
        ValueError,
        match=r"no rotary parameters for layer_type='full_attention'; pass layer_type=None",
    ):
        ours(torch.zeros(1), torch.arange(4)[None], "full_attention")
    gemma = HFRotaryEmbedding(F.tiny_model(family_index("gemma3")).config)
    with pytest.raises(
        ValueError, match=r"pass one of \['full_attention', 'sliding_attention'\]"
    ):
        gemma(torch.zeros(1), torch.arange(4)[None])
    vl = HFRotaryEmbedding(F.tiny_model(family_index("qwen2_vl")).config)
    with pytest.raises(ValueError, match=r"position_ids must be \[3, batch, seq_len\]"):
        vl(torch.zeros(1), torch.arange(4).expand(2, 1, -1))
    # [batch, seq_len] is given to every axis, as transformers does
    assert torch.equal(
        vl(torch.zeros(1), torch.arange(4)[None])[0],
        vl(torch.zeros(1), torch.arange(4).expand(3, 1, -1))[0],
    )


def test_negative_positions_turn_backwards_as_in_transformers():
    # no value is read to check positions (a host sync on a GPU): they are taken as transformers takes them
    index = family_index("llama", "default")
    model = F.tiny_model(index)
    theirs = F.rotary_of(model, F.FAMILIES[index])
    ids = torch.arange(-5, 5)[None]
    cos, sin = HFRotaryEmbedding(model.config)(torch.zeros(1), ids)
    hf_cos, hf_sin = theirs(torch.zeros(1), ids)
    assert (cos - hf_cos).abs().max() <= 2**-20 and (sin - hf_sin).abs().max() <= 2**-20
    # sin(-p w) = -sin(p w): positions -4..-1 mirror 1..4
    assert (sin[0, 1:5] + sin[0, 6:10].flip(0)).abs().max() <= 2**-24


def test_families_without_a_rotary_module_are_refused_with_the_reason():
    import transformers

    for config in (
        transformers.GPTJConfig(n_layer=1),
        transformers.CodeGenConfig(n_layer=1),
    ):
        with pytest.raises(
            ValueError, match=r"no single model class with a rotary_emb module"
        ):
            HFRotaryEmbedding(config)
        with pytest.raises(
            ValueError, match=r"no single model class with a rotary_emb module"
        ):
            RotaryEmbedding.from_hf_config(config)


def test_a_rotation_posenc_cannot_express_is_refused():
    # NanoChat's rotate_half turns the other way (cat(x2, -x1)): no layout of posenc gives its scores
    import transformers

    config = transformers.NanoChatConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                                         num_hidden_layers=1, vocab_size=64)  # fmt: skip
    HFRotaryEmbedding(config)  # its tables are read (the swap is fine)
    with pytest.raises(
        ValueError, match=r"match neither of posenc's layouts 'half' and 'interleaved'"
    ):
        RotaryEmbedding.from_hf_config(config)


def test_from_hf_config_reads_dynamic_and_longrope_parameters_as_they_are():
    # the config's own rope_parameters, without max_position_embeddings added by hand
    for name in ("qwen3", "phi3"):
        config = F.tiny_model(family_index(name)).config
        assert "max_position_embeddings" not in config.rope_parameters
        rope = RotaryEmbedding.from_hf_config(config)
        assert rope.rope_type == config.rope_parameters["rope_type"]


def test_from_hf_config_warns_of_keys_no_table_reads():
    import transformers

    config = transformers.Ministral3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                           head_dim=16, num_hidden_layers=1, vocab_size=64)  # fmt: skip
    assert "llama_4_scaling_beta" in config.rope_parameters
    with pytest.warns(
        UserWarning,
        match=r"llama_4_scaling_beta.*attention of your own must do the same",
    ):
        rope = RotaryEmbedding.from_hf_config(config)
    assert rope.layout == "half"


def test_posenc_exports_the_module():
    assert (
        posenc.HFRotaryEmbedding is HFRotaryEmbedding
        and "HFRotaryEmbedding" in posenc.__all__
    )


# Deployment of dynamic NTK: an export would forget its state; vmap must leave none behind


def _dynamic():
    return HFRotaryEmbedding(
        F.tiny_model(family_index("qwen3")).config
    )  # max_position_embeddings 16


def test_dynamic_is_refused_by_torch_export_naming_posenc_and_what_works():
    ours = _dynamic()
    ours(
        torch.zeros(1), torch.arange(40)[None]
    )  # grown past 16: the state an export would drop

    class Tables(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rotary = ours

        def forward(self, x, ids):
            return self.rotary(x, ids)

    for strict in (True, False):
        with pytest.raises(
            Exception, match=r"posenc.HFRotaryEmbedding.*'dynamic'.*static rope_type"
        ):
            torch.export.export(
                Tables(), (torch.zeros(1), torch.arange(20)[None]), strict=strict
            )
    # eager keeps working, with its state
    eager = _dynamic()
    for length in (40, 20):
        expected = eager(torch.zeros(1), torch.arange(length)[None])[0]
        assert torch.equal(
            ours(torch.zeros(1), torch.arange(length)[None])[0], expected
        )


def test_dynamic_refuses_vmap_and_keeps_no_state_from_it():
    # dynamic NTK's tables depend on the calls before: inside vmap the call is refused,
    # naming posenc, and a later plain call is a fresh module's
    ours, plain = _dynamic(), _dynamic()
    ids = torch.arange(40)[None].expand(3, -1)[:, None]  # [3, 1, 40]: position sets
    with pytest.raises(NotImplementedError, match=r"posenc\.HFRotaryEmbedding"):
        torch.func.vmap(lambda p: ours(torch.zeros(1), p)[0])(ids)
    after = ours(torch.zeros(1), torch.arange(40)[None])[0]
    assert torch.equal(after, plain(torch.zeros(1), torch.arange(40)[None])[0])


# posenc.swap_rotary: every rotary module of a model, found by what it is


def test_swap_rotary_replaces_every_rotary_module_and_keeps_the_outputs():
    index = family_index("llama")
    model = F.tiny_model(index)
    inputs = F.prompt(F.FAMILIES[index])
    with torch.no_grad():
        before = model(**inputs).logits
    assert posenc.swap_rotary(model) == {"model.rotary_emb": "LlamaRotaryEmbedding"}
    assert isinstance(model.model.rotary_emb, HFRotaryEmbedding)
    with torch.no_grad():
        after = model(**inputs).logits
    assert (after - before).abs().max() <= bound(before)
    assert (
        "swap_rotary" in posenc.__all__
        and posenc.conventions.swap_rotary is posenc.swap_rotary
    )


def test_swap_rotary_reaches_an_encoder_and_a_decoder():
    from tests.census import builder

    model = builder.tiny_model("t5gemma")
    replaced = posenc.swap_rotary(model)
    assert set(replaced) == {"model.encoder.rotary_emb", "model.decoder.rotary_emb"}
    assert all(isinstance(model.get_submodule(p), HFRotaryEmbedding) for p in replaced)


def test_swap_rotary_refuses_naming_the_module_and_leaves_the_model_untouched():
    import transformers

    model = transformers.NanoChatForCausalLM(transformers.NanoChatConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1, vocab_size=64))  # fmt: skip
    own = model.model.rotary_emb
    config = copy.deepcopy(own.config)
    own.config = config
    config.rope_parameters = dict(config.rope_parameters, rope_type="no-such-type")
    with pytest.raises(
        ValueError,
        match=r"posenc.swap_rotary: model.rotary_emb \(NanoChatRotaryEmbedding\)",
    ):
        posenc.swap_rotary(model)
    assert model.model.rotary_emb is own
    with pytest.raises(
        ValueError, match=r"posenc.swap_rotary: GPTJForCausalLM holds no rotary module"
    ):
        posenc.swap_rotary(
            transformers.GPTJForCausalLM(
                transformers.GPTJConfig(n_layer=1, n_embd=64, n_head=4)
            )
        )


def test_a_module_with_two_position_axes_and_no_mrope_section_reads_both():
    # NeoMME's model feeds its rotary module [2, batch, seq_len] (interleaved rows and columns), its config names
    # no mrope_section: the axes are read from the module
    from tests.census import builder

    model = builder.tiny_model("neomme")
    theirs = model.model.rotary_emb
    ours = posenc.swap_rotary(model) and model.model.rotary_emb
    ids = torch.stack([torch.arange(7), torch.arange(7).flip(0)])[
        :, None
    ]  # [2, 1, 7], distinct per axis
    for layer_type in ours.layer_types:
        assert ours._layouts[layer_type].axes == 2
        for a, b in zip(
            ours(torch.zeros(1), ids, layer_type),
            theirs(torch.zeros(1), ids, layer_type),
        ):
            assert a.shape == b.shape and (a - b).abs().max() <= 2**-20


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_config_holding_rope_theta_itself_gives_its_base():
    # ESM keeps rope_theta beside its keys (no rope_parameters): a base other than 10000 must be read
    import transformers

    config = transformers.EsmConfig(
        vocab_size=33, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
        position_embedding_type="rotary", rope_theta=5e5, initializer_range=0.2, pad_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.EsmForMaskedLM(config).eval()
    ids = torch.randint(4, 30, (2, 12), generator=torch.Generator().manual_seed(0))
    before = _logits(model, ids)
    assert posenc.swap_rotary(model) == {"esm.rotary_embeddings": "EsmRotaryEmbedding"}
    assert (_logits(model, ids) - before).abs().max() <= bound(before)


def test_per_layer_type_tables_only_for_the_types_the_module_builds():
    # LFM3's module builds <type>_inv_freq only for the types among config.layer_types: two tiny layers, a
    # convolution and a full-attention one, leave its rope_parameters' sliding_attention without tables
    from tests.census import builder

    model = builder.tiny_model("lfm3")
    assert "sliding_attention" not in model.config.layer_types
    assert "sliding_attention" in model.config.rope_parameters
    ids = builder.inputs(model)["input_ids"]
    before = _logits(model, ids)
    posenc.swap_rotary(model)
    assert model.model.rotary_emb.layer_types == ["full_attention"]
    assert (_logits(model, ids) - before).abs().max() <= bound(before)


def test_mrope_sections_with_a_zero_axis():
    # GLM-4V-MoE's mrope_section [0, 2, 2]: no pair turns with time, two with height and two with width
    import transformers
    from transformers.models.glm4v_moe import modeling_glm4v_moe as glm

    from tests.census import builder

    params = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5,
              "mrope_section": [0, 2, 2]}  # fmt: skip
    cls = transformers.Glm4vMoeTextConfig
    config = cls(**{**builder.tiny_kwargs(cls), "rope_parameters": params})
    theirs, ours = glm.Glm4vMoeTextRotaryEmbedding(config), HFRotaryEmbedding(config)
    ids = torch.stack([torch.arange(9), torch.arange(9) * 3, torch.arange(9).flip(0)])
    ids = ids[:, None]  # [3, 1, 9], a different position on every axis
    layout = ours._layouts[None]
    assert layout.axes == 3 and set(layout.axis.tolist()) == {1, 2}
    for a, b in zip(ours(torch.zeros(1), ids), theirs(torch.zeros(1), ids)):
        assert a.shape == b.shape and (a - b).abs().max() <= 2**-20


# --- which layers rotate ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "index",
    [
        i
        for i, f in enumerate(F.FAMILIES)
        if f.name in ("llama", "cohere2", "gemma3", "deepseek_v3")
    ],
)
def test_rotated_layers_are_those_whose_attention_rotates(index: int) -> None:
    """posenc.conventions.rotated_layers reads the condition around the rotation in the family's attention code;
    a spy on the rotation function in a forward of the tiny model sees the same layers (Cohere 2: its
    sliding-window layer only)."""
    from posenc.conventions import rotated_layers

    model = copy.deepcopy(F.tiny_model(index))
    expected, _ = layers_that_rotate(model, {"input_ids": torch.tensor([[1, 2, 3, 4]])})
    assert rotated_layers(model.config) == expected
    if F.FAMILIES[index].name == "cohere2":
        assert expected == (0,)  # layer_types: sliding, then full attention


def test_from_hf_config_names_the_layers_that_rotate() -> None:
    cohere2 = next(f for f in F.FAMILIES if f.name == "cohere2")
    llama = next(f for f in F.FAMILIES if f.name == "llama")
    with pytest.warns(UserWarning, match=r"rotates q and k only in layers \[0\] of 2"):
        RotaryEmbedding.from_hf_config(F.tiny_config(cohere2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        RotaryEmbedding.from_hf_config(F.tiny_config(llama))  # every layer: no warning
