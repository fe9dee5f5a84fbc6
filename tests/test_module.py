"""posenc.PositionalEncoding and get_positional_encoding: drop-in equality with the classic modules (labml's,
spotpython's, the PyTorch tutorial's, whose language model runs unchanged with posenc swapped in), layouts, long
sequences, offsets, explicit positions, dtypes, dropout, the cache and checkpoints."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import Tensor, nn
from torch.nn import TransformerEncoder, TransformerEncoderLayer

import posenc.module
from posenc import PositionalEncoding, get_positional_encoding, sinusoidal_encoding
from tests.classic import (
    LabmlPositionalEncoding,
    SpotpythonPositionalEncoding,
    TutorialPositionalEncoding,
    labml_get_positional_encoding,
)
from tests.test_precision import round_once as single_rounding


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# --- drop-in ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "classic_cls",
    [LabmlPositionalEncoding, SpotpythonPositionalEncoding, TutorialPositionalEncoding],
)
@pytest.mark.parametrize("d_model", [2, 16, 512])
def test_same_outputs_as_the_classic_modules_below_position_256(
    classic_cls: type[nn.Module], d_model: int
) -> None:
    x = torch.randn(256, 3, d_model)
    classic = classic_cls(d_model, 0.1, max_len=300).eval()
    ours = PositionalEncoding(d_model, 0.1, max_len=300).eval()
    difference = (ours(x) - classic(x)).abs()
    # The classic recipe forms w_i = exp(-2i log(base)/d) and p * w_i in float32: each carries a relative error
    # of a few 2^-24, so at p < 256 its angles (and values) are off by up to ~256 * 6e-8 = 1.5e-5 (measured:
    # 3.9e-6 at d_model=16, 1.41e-5 from d_model=128 on). posenc is exact to float32 rounding, so the difference
    # is the classic recipe's own error plus the rounding of the sums (|x| < 5: 2 * 2^-22).
    classic_error = (classic(torch.zeros(256, 1, d_model)) - sinusoidal_encoding(256, d_model, dtype=torch.float64)
                     .unsqueeze(1).float()).abs()  # fmt: skip
    assert (difference <= classic_error + 5e-7).all()
    assert difference.max() < 1.5e-5


def test_same_table_as_labml_get_positional_encoding() -> None:
    ours, classic = (
        get_positional_encoding(64, 256),
        labml_get_positional_encoding(64, 256),
    )
    assert ours.shape == classic.shape == (256, 1, 64) and ours.dtype == torch.float32
    assert (ours - classic).abs().max() < 1e-5
    assert get_positional_encoding(64).shape == (5000, 1, 64)


def test_spotpython_documented_example() -> None:
    """spotpython documents a (1, 3, 10) input whose rows hold 0, 1, 2 and an output of 0,1,0,1 added to each."""
    x = torch.zeros(1, 3, 10)
    for i in range(3):
        x[0, i, :] = i
    out = PositionalEncoding(d_model=10, dropout_prob=0)(x)
    expected = torch.tensor([[i, i + 1.0] * 5 for i in range(3)]).unsqueeze(0)
    assert torch.equal(out, expected)
    assert torch.equal(out, SpotpythonPositionalEncoding(10, 0)(x))
    # the pitfall: sequence-first, that is one position; batch_first reads it as three positions
    batch_first = PositionalEncoding(d_model=10, batch_first=True)(x)
    assert torch.equal(batch_first[0], x[0] + sinusoidal_encoding(3, 10))


def test_constructor_signature_is_positional_compatible() -> None:
    module = PositionalEncoding(32, 0.2, 100)
    assert (module.d_model, module.dropout.p, module.max_len) == (32, 0.2, 100)
    assert isinstance(module.dropout, nn.Dropout)


def test_the_tutorials_dropout_keyword_is_accepted() -> None:
    """The PyTorch tutorial's module takes ``dropout=``, labml's and spotpython's ``dropout_prob=``: either works,
    both at once is an error that names both, and neither means no dropout."""
    assert PositionalEncoding(32, dropout=0.3).dropout.p == 0.3
    assert PositionalEncoding(32, dropout=0.3, max_len=7).max_len == 7
    assert PositionalEncoding(32, dropout_prob=0.3).dropout.p == 0.3
    assert PositionalEncoding(32).dropout.p == 0.0
    with pytest.raises(TypeError, match=r"dropout_prob=0\.1 and dropout=0\.2"):
        PositionalEncoding(32, 0.1, dropout=0.2)
    with pytest.raises(ValueError, match=r"^dropout must be in \[0, 1\], got 1\.5"):
        PositionalEncoding(32, dropout=1.5)


def tutorial_language_model(PositionalEncoding: type[nn.Module]) -> type[nn.Module]:
    """The model of the PyTorch tutorial "Language Modeling with nn.Transformer" (``TransformerModel``), its code
    as the tutorial writes it, with ``PositionalEncoding`` bound to the class given: the tutorial's own or posenc's.
    It builds the module as ``PositionalEncoding(d_model, dropout=dropout)`` (the tutorial passes ``dropout``
    positionally, which posenc always accepted) and feeds it ``[seq_len, batch, d_model]``."""

    class TransformerModel(nn.Module):
        def __init__(
            self,
            ntoken: int,
            d_model: int,
            nhead: int,
            d_hid: int,
            nlayers: int,
            dropout: float = 0.5,
        ) -> None:
            super().__init__()
            self.model_type = "Transformer"
            self.pos_encoder = PositionalEncoding(d_model, dropout=dropout)
            encoder_layers = TransformerEncoderLayer(d_model, nhead, d_hid, dropout)
            self.transformer_encoder = TransformerEncoder(encoder_layers, nlayers)
            self.embedding = nn.Embedding(ntoken, d_model)
            self.d_model = d_model
            self.linear = nn.Linear(d_model, ntoken)
            self.init_weights()

        def init_weights(self) -> None:
            initrange = 0.1
            self.embedding.weight.data.uniform_(-initrange, initrange)
            self.linear.bias.data.zero_()
            self.linear.weight.data.uniform_(-initrange, initrange)

        def forward(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
            """src: ``[seq_len, batch]`` token ids -> ``[seq_len, batch, ntoken]``."""
            src = self.embedding(src) * math.sqrt(self.d_model)
            src = self.pos_encoder(src)
            output = self.transformer_encoder(src, src_mask)
            output = self.linear(output)
            return output

    return TransformerModel


# the tutorial's TransformerEncoder (batch_first=False) warns that it cannot use nested tensors
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
def test_the_pytorch_tutorials_language_model_runs_with_posenc_swapped_in() -> None:
    """The tutorial's hyperparameters scaled down (its emsize 200 -> 32, bptt 35 kept): the same initial weights,
    the tutorial's checkpoint loads strictly, and eval outputs, a training step's loss (dropout masks drawn in the
    same order) and the weights after the tutorial's SGD step with gradient clipping agree to within the classic
    table's float32 rounding at positions < 35 (measured: 4e-7 on the eval outputs)."""
    args = {"ntoken": 50, "d_model": 32, "nhead": 2, "d_hid": 64, "nlayers": 2}
    models = {}
    for name, positional in (
        ("tutorial", TutorialPositionalEncoding),
        ("posenc", PositionalEncoding),
    ):
        torch.manual_seed(0)
        models[name] = tutorial_language_model(positional)(**args, dropout=0.2)
    tutorial, swapped = models["tutorial"], models["posenc"]
    assert swapped.pos_encoder.dropout.p == 0.2
    state = tutorial.state_dict()
    assert "pos_encoder.pe" in state and "pos_encoder.pe" not in swapped.state_dict()
    result = swapped.load_state_dict(
        state, strict=True
    )  # the tutorial's checkpoint; its table is dropped
    assert result.missing_keys == [] and result.unexpected_keys == []

    data = torch.randint(
        0, 50, (35, 4)
    )  # [seq_len, batch], as the tutorial's get_batch returns
    targets = torch.randint(0, 50, (35 * 4,))
    mask = nn.Transformer.generate_square_subsequent_mask(35)
    with torch.no_grad():
        expected, got = (m.eval()(data, mask) for m in (tutorial, swapped))
    assert got.shape == (35, 4, 50)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)

    losses = {}
    for name, model in models.items():
        optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
        model.train()
        torch.manual_seed(1)  # the same dropout masks for both
        output = model(data)
        loss = nn.CrossEntropyLoss()(output.view(-1, 50), targets)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        losses[name] = loss.item()
    assert losses["posenc"] == pytest.approx(losses["tutorial"], abs=1e-5)
    for (key, before), after in zip(tutorial.named_parameters(), swapped.parameters()):
        torch.testing.assert_close(after, before, atol=1e-5, rtol=0, msg=key)


# --- layouts and positions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "concat"])
@pytest.mark.parametrize("schedule", ["paper", "tensor2tensor"])
def test_both_batch_layouts_agree_with_the_function(layout: str, schedule: str) -> None:
    x = torch.randn(12, 4, 10)  # [seq, batch, d]
    kwargs = {"layout": layout, "frequencies": schedule}
    table = sinusoidal_encoding(12, 10, **kwargs)
    seq_first = PositionalEncoding(10, **kwargs)(x)
    batch_first = PositionalEncoding(10, batch_first=True, **kwargs)(
        x.transpose(0, 1).contiguous()
    )
    assert torch.equal(seq_first, x + table.unsqueeze(1))
    assert torch.equal(batch_first.transpose(0, 1), seq_first)


@pytest.mark.parametrize("batch_first", [False, True])
def test_longer_than_max_len_is_computed_on_the_fly(batch_first: bool) -> None:
    module = PositionalEncoding(8, max_len=10, batch_first=batch_first)
    x = torch.randn(2, 50, 8) if batch_first else torch.randn(50, 2, 8)
    table = sinusoidal_encoding(50, 8)
    expected = x + (table if batch_first else table.unsqueeze(1))
    assert torch.equal(module(x), expected)
    assert all(table.shape[0] == 10 for table in module._tables.values()), (
        "the cache never grows"
    )
    module(x[:5] if not batch_first else x[:, :5])
    assert all(table.shape[0] == 10 for table in module._tables.values())


@pytest.mark.parametrize("batch_first", [False, True])
def test_offset_decoding_equals_the_full_forward_bitwise(batch_first: bool) -> None:
    module = PositionalEncoding(16, max_len=20, batch_first=batch_first).eval()
    seq_axis = 1 if batch_first else 0
    x = torch.randn(3, 30, 16) if batch_first else torch.randn(30, 3, 16)
    full = module(x)
    steps = [
        module(x.narrow(seq_axis, t, 1), offset=t) for t in range(30)
    ]  # crosses max_len at t = 20
    assert torch.equal(torch.cat(steps, dim=seq_axis), full)


def test_explicit_positions_shared_and_per_sequence() -> None:
    x = torch.randn(5, 2, 8)  # [seq, batch, d]
    module = PositionalEncoding(8)
    shared = torch.tensor([4, 3, 2, 1, 0])
    assert torch.equal(
        module(x, positions=shared), x + sinusoidal_encoding(shared, 8).unsqueeze(1)
    )
    per_sequence = torch.tensor(
        [[0, 1, 2, 0, 1], [0, 0, 0, 1, 2]]
    )  # [batch, seq]: packing and left padding
    expected = x + sinusoidal_encoding(per_sequence, 8).transpose(0, 1)
    assert torch.equal(module(x, positions=per_sequence), expected)
    bf = PositionalEncoding(8, batch_first=True)
    xb = x.transpose(0, 1)
    assert torch.equal(
        bf(xb, positions=per_sequence), xb + sinusoidal_encoding(per_sequence, 8)
    )
    assert torch.equal(module(x, positions=torch.arange(5)), module(x)), (
        "arange positions == default"
    )


def test_positions_may_exceed_max_len_and_exclude_offset() -> None:
    module = PositionalEncoding(8, max_len=4)
    x = torch.zeros(3, 1, 8)
    positions = torch.tensor([100, 200, 10**6])
    assert torch.equal(
        module(x, positions=positions), sinusoidal_encoding(positions, 8).unsqueeze(1)
    )
    with pytest.raises(
        ValueError, match=r"either offset or positions, not both \(got offset=7\)"
    ):
        module(x, positions=positions, offset=7)


# --- dtypes, devices, dropout ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64]
)
def test_output_follows_x_dtype_with_the_float64_value_rounded_once(
    dtype: torch.dtype,
) -> None:
    module = PositionalEncoding(64, max_len=100)
    x = torch.zeros(300, 2, 64, dtype=dtype)  # beyond max_len too
    out = module(x)
    assert out.dtype == dtype and out.shape == x.shape
    exact = sinusoidal_encoding(300, 64, dtype=torch.float64).numpy()
    # single_rounding: float64 -> dtype in one step (torch's .to goes through float32 for half dtypes)
    expected = torch.from_numpy(single_rounding(exact, dtype)).to(dtype)
    assert torch.equal(out[:, 0], expected), (
        "angles never formed in half precision, rounded once"
    )
    assert torch.equal(
        module(x, offset=2000)[:, 1],
        sinusoidal_encoding(torch.arange(2000, 2300), 64, dtype=dtype),
    )


def test_dropout_only_in_training() -> None:
    module = PositionalEncoding(16, dropout_prob=0.5)
    x = torch.ones(64, 4, 16)
    train = module.train()(x)
    assert (train == 0).float().mean().item() == pytest.approx(0.5, abs=0.05)
    nonzero = train != 0
    assert torch.allclose(
        train[nonzero], (2 * (x + sinusoidal_encoding(64, 16).unsqueeze(1)))[nonzero]
    )
    assert torch.equal(module.eval()(x), x + sinusoidal_encoding(64, 16).unsqueeze(1))


def test_gradient_flows_to_x_only() -> None:
    x = torch.randn(6, 2, 8, requires_grad=True)
    PositionalEncoding(8)(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_meta_device_shapes() -> None:
    out = PositionalEncoding(8)(torch.empty(5, 2, 8, device="meta"))
    assert out.device.type == "meta" and out.shape == (5, 2, 8)


# --- cache and checkpoints ----------------------------------------------------------------------------------


def test_nothing_in_state_dict_or_buffers() -> None:
    module = PositionalEncoding(32, 0.1, max_len=100)
    module(torch.zeros(10, 1, 32))
    assert (
        list(module.state_dict()) == []
        and list(module.buffers()) == []
        and list(module.parameters()) == []
    )


def test_one_cached_table_per_device_and_dtype() -> None:
    module = PositionalEncoding(8, max_len=16)
    for dtype in (torch.float32, torch.float32, torch.float64):
        module(torch.zeros(4, 1, 8, dtype=dtype))
    assert set(module._tables) == {
        (torch.device("cpu"), torch.float32),
        (torch.device("cpu"), torch.float64),
    }
    assert module._tables[(torch.device("cpu"), torch.float32)].shape == (16, 1, 8)
    module.to(
        torch.float64
    )  # no buffers: casting the module changes nothing, x's dtype decides
    assert module(torch.zeros(4, 1, 8, dtype=torch.float16)).dtype == torch.float16


@pytest.mark.parametrize(
    "classic_cls",
    [LabmlPositionalEncoding, SpotpythonPositionalEncoding, TutorialPositionalEncoding],
)
def test_classic_checkpoints_load_strictly(classic_cls: type[nn.Module]) -> None:
    class Model(nn.Module):
        def __init__(self, positional: nn.Module) -> None:
            super().__init__()
            self.embed = nn.Linear(4, 16)
            self.pos = positional

    old = Model(classic_cls(16, 0.1, max_len=64))
    state = old.state_dict()
    if classic_cls is LabmlPositionalEncoding:
        # labml's PositionalEncoding saves no table (persistent=False): its state_dict is empty. Its
        # EmbeddingsWithPositionalEncoding saves one under this name; a checkpoint with it loads as well
        assert "pos.positional_encodings" not in state
        state["pos.positional_encodings"] = old.pos.positional_encodings
    new = Model(PositionalEncoding(16, 0.1, max_len=10))
    result = new.load_state_dict(state, strict=True)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(new.embed.weight, old.embed.weight)


def test_classic_checkpoint_of_the_wrong_width_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="width 8, this module has d_model=16"):
        PositionalEncoding(16).load_state_dict(
            SpotpythonPositionalEncoding(8, 0.0, max_len=10).state_dict()
        )


def test_a_posenc_checkpoint_loads_into_another_max_len() -> None:
    saved = nn.Sequential(
        nn.Linear(8, 8), PositionalEncoding(8, max_len=5)
    ).state_dict()
    target = nn.Sequential(nn.Linear(8, 8), PositionalEncoding(8, max_len=500))
    assert target.load_state_dict(saved, strict=True).missing_keys == []


def test_repr_names_the_configuration() -> None:
    text = repr(PositionalEncoding(8, 0.1, 64, batch_first=True))
    assert (
        "d_model=8" in text
        and "max_len=64" in text
        and "batch_first=True" in text
        and "p=0.1" in text
    )


def test_docstrings_read_as_plain_text() -> None:
    """help() shows docstrings raw: math is written in plain Unicode (θ, ω_i, 2^-24), never LaTeX."""
    objects = [posenc.module, PositionalEncoding, get_positional_encoding]
    objects += [PositionalEncoding.forward, PositionalEncoding.encoding]
    for obj in objects:
        doc = obj.__doc__ or ""
        assert "$" not in doc and not re.search(r"\\[A-Za-z]+", doc), obj
