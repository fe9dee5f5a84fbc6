"""posenc under torch.compile and torch.export on CPU: the compiled or exported program matches eager mode.

Two paths are checked. Within ``max_len`` the compiled graph reads the cached table (built while tracing, outside
the graph), so it adds the same float32 rows as eager mode and matches bitwise. Past ``max_len``, and in an exported
program, the encoding is computed inside the graph by another kernel (inductor's sin/cos and pow, not ATen's), so
it matches to the tolerance derived in ``tolerance`` (tests/references/compiled.py). The chapter
book/11_gpu.ipynb states the same results.

Compilation on CPU is slow (inductor builds C++), so the structural checks use a backend that only records the
graph and runs it eagerly, and a few tests compile for real.
"""

from __future__ import annotations

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from posenc import PositionalEncoding, sinusoidal_encoding
from tests.references.compiled import TinyModel, recording_backend, tolerance
from tests.references.floors import needs_compile, needs_export


def computes_sines(gm: torch.fx.GraphModule) -> bool:
    return any("sin" in str(node.target) for node in gm.graph.nodes)


@needs_compile
def test_compiled_graph_reads_the_cached_table():
    graphs: list[torch.fx.GraphModule] = []
    module = PositionalEncoding(16, max_len=32).eval()
    compiled = torch.compile(module, backend=recording_backend(graphs), fullgraph=True)
    x = torch.randn(5, 2, 16)
    assert torch.equal(compiled(x), module(x))
    assert len(graphs) == 1 and not computes_sines(graphs[0]), (
        "the table must be read, not computed, in the graph"
    )
    # the cache was filled with a real tensor while tracing (not a fake one), exact to float32 rounding
    table = module._tables[(torch.device("cpu"), torch.float32)]
    assert type(table) is torch.Tensor and not isinstance(table, FakeTensor)
    assert torch.equal(table[:, 0], sinusoidal_encoding(32, 16))


@needs_compile
def test_compiled_graph_computes_past_max_len_and_stores_nothing():
    graphs: list[torch.fx.GraphModule] = []
    module = PositionalEncoding(16, max_len=8).eval()
    compiled = torch.compile(module, backend=recording_backend(graphs), fullgraph=True)
    x = torch.randn(20, 2, 16)
    assert torch.equal(compiled(x), x + sinusoidal_encoding(20, 16).unsqueeze(1))
    assert computes_sines(graphs[-1])
    assert module._tables == {}


@needs_compile
def test_compiled_training_mode_applies_the_same_dropout():
    module = PositionalEncoding(16, dropout_prob=0.5, max_len=32)
    compiled = torch.compile(module, backend=recording_backend([]), fullgraph=True)
    x = torch.randn(6, 3, 16)
    torch.manual_seed(1)
    eager = module(x)
    torch.manual_seed(1)
    assert torch.equal(
        compiled(x), eager
    )  # the graph runs the same ATen dropout, drawing the same mask


@needs_compile
def test_inductor_fullgraph_fixed_length_matches_eager():
    torch._dynamo.reset()
    module = PositionalEncoding(32, max_len=64).eval()
    compiled = torch.compile(module, fullgraph=True, dynamic=False)
    for _ in range(2):
        x = torch.randn(10, 3, 32)
        assert torch.equal(compiled(x), module(x))


@needs_compile
def test_inductor_dynamic_lengths_and_offsets_match_eager():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    module = PositionalEncoding(32, max_len=64, batch_first=True).eval()
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    for seq_len, offset in [(3, 0), (7, 0), (20, 5), (11, 17), (30, 30)]:
        x = torch.randn(2, seq_len, 32)
        assert torch.equal(compiled(x, offset=offset), module(x, offset=offset)), (
            seq_len,
            offset,
        )
    # one graph for every length and offset within the cache (two if a torch version specialises offset=0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2


@needs_compile
def test_inductor_past_max_len_matches_eager_within_derived_tolerance():
    torch._dynamo.reset()
    module = PositionalEncoding(24, max_len=8).eval()
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    for dtype in (
        torch.float32,
        torch.float64,
        torch.bfloat16,
    ):  # bfloat16: rounded once inside the graph too
        for seq_len in (40, 90):
            x = torch.randn(seq_len, 2, 24, dtype=dtype)
            torch.testing.assert_close(
                compiled(x), module(x), **tolerance(dtype, max_angle=seq_len)
            )


@needs_export
def test_export_matches_eager_for_every_length_and_holds_no_table():
    torch.manual_seed(0)
    model = TinyModel().eval()
    seq = torch.export.Dim("seq", min=2, max=4096)
    program = torch.export.export(
        model, (torch.randint(0, 50, (6, 2)),), dynamic_shapes={"tokens": {0: seq}}
    )
    assert model.pe._tables == {}, "exporting must not fill the module's cache"
    assert len(program.constants) == 0, "the exported program must not bake a table in"
    assert computes_sines(program.graph_module)
    exported = program.module()
    for seq_len in (2, 17, 32, 100):  # 100 > max_len: the program has no cache limit
        tokens = torch.randint(0, 50, (seq_len, 2))
        torch.testing.assert_close(
            exported(tokens),
            model(tokens),
            **tolerance(torch.float32, max_angle=seq_len),
        )


@needs_export
def test_export_with_explicit_positions_and_an_offset():
    module = PositionalEncoding(16, batch_first=True).eval()
    x, positions = (
        torch.randn(2, 6, 16),
        torch.tensor([[0, 1, 2, 0, 1, 2], [5, 6, 7, 8, 9, 10]]),
    )

    class WithPositions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pe = module

        def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return self.pe(x, positions=positions)

    seq = torch.export.Dim("seq", min=2, max=4096)
    program = torch.export.export(
        WithPositions(),
        (x, positions),
        dynamic_shapes={"x": {1: seq}, "positions": {1: seq}},
    )
    for seq_len in (3, 9):
        x, positions = torch.randn(2, seq_len, 16), torch.randint(0, 1000, (2, seq_len))
        expected = module(x, positions=positions)
        torch.testing.assert_close(
            program.module()(x, positions), expected, **tolerance(torch.float32, 1000)
        )
    # an int offset is a Python constant to export: the program keeps the offset it was exported with
    program = torch.export.export(module, (x,), {"offset": 7})
    torch.testing.assert_close(
        program.module()(x, offset=7),
        module(x, offset=7),
        **tolerance(torch.float32, 100),
    )


@needs_export
def test_strict_export_matches_eager():
    model = TinyModel().eval()
    seq = torch.export.Dim("seq", min=2, max=4096)
    tokens = torch.randint(0, 50, (6, 2))
    program = torch.export.export(
        model, (tokens,), dynamic_shapes={"tokens": {0: seq}}, strict=True
    )
    assert model.pe._tables == {} and len(program.constants) == 0
    tokens = torch.randint(0, 50, (100, 2))
    torch.testing.assert_close(
        program.module()(tokens),
        model(tokens),
        **tolerance(torch.float32, max_angle=100),
    )


def test_jit_trace_of_a_fresh_module_matches_eager_at_other_lengths():
    """TorchScript tracing (deprecated, still deployed): the table is built outside the trace, so tracing a fresh
    module passes torch's check that two traced invocations record the same graph."""
    import warnings

    for batch_first in (False, True):
        module = PositionalEncoding(16, max_len=64, batch_first=batch_first).eval()
        example = torch.randn(5, 2, 16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript's deprecation notice
            traced = torch.jit.trace(module, example)
        for seq_len in (1, 5, 9, 64):
            x = torch.randn(seq_len, 2, 16)
            assert torch.equal(traced(x), module(x))


def test_jit_script_raises_a_clear_error_naming_the_alternatives():
    import warnings

    import pytest

    for model in (
        PositionalEncoding(16),
        nn.Sequential(nn.Linear(16, 16), PositionalEncoding(16)),
    ):
        with (
            warnings.catch_warnings(),
            pytest.raises(TypeError, match=r"torch\.export\.export.*torch\.jit\.trace"),
        ):
            warnings.simplefilter("ignore")
            torch.jit.script(model)


@needs_compile
def test_constant_marks_are_the_ones_torch_sets_and_import_skips_dynamo():
    """posenc marks its compile-time constants itself (``posenc._tables.assume_constant_result``), so that
    ``import posenc`` does not import torch._dynamo; the mark must be exactly what
    ``torch.compiler.assume_constant_result`` sets (the compile tests then exercise it)."""
    import subprocess
    import sys

    import torch

    from posenc import _tables
    from posenc.sinusoidal import module

    def probe():
        return 1

    marked = torch.compiler.assume_constant_result(probe)
    assert marked is probe and set(vars(probe)) == {"_dynamo_marked_constant"}
    for fn in (_tables._build_outside_graph, module._constant_base):
        assert {k: v for k, v in vars(fn).items() if k.startswith("_dynamo")} == vars(
            probe
        ), fn
    check = "import sys, posenc; sys.exit('torch._dynamo' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True
    )
    assert result.returncode == 0, "import posenc imports torch._dynamo" + result.stderr


@needs_compile
def test_compiled_decoding_is_traced_once_not_once_per_offset() -> None:
    # one token per step at offsets 2..13, as a decoding loop calls the module: the offset is traced as a symbol
    # (dynamic=None: a static first graph, then one symbolic one), not one graph per offset
    from torch._dynamo.utils import counters

    for dynamic, most in ((True, 1), (None, 2)):
        torch._dynamo.reset()
        module = PositionalEncoding(64, max_len=64).eval()
        compiled = torch.compile(
            module, backend="eager", fullgraph=True, dynamic=dynamic
        )
        counters.clear()
        for offset in range(2, 14):
            x = torch.randn(1, 2, 64)
            assert torch.equal(compiled(x, offset=offset), module(x, offset=offset))
        assert counters["stats"]["unique_graphs"] <= most, (
            dynamic,
            dict(counters["stats"]),
        )
    torch._dynamo.reset()


@needs_compile
def test_compiled_negative_offset_raises_also_once_symbolic() -> None:
    """A negative int offset raises under torch.compile as in eager mode, also once decoding steps (or
    ``dynamic=True``) have made the offset a symbol, where a slice would take rows from the table's end. Under
    ``fullgraph=True`` torch reports the ValueError as an unsupported graph break that carries its message."""
    import pytest

    x = torch.randn(3, 1, 8)
    for dynamic, fullgraph, warm_up in ((None, True, range(2, 6)), (True, False, [2])):
        torch._dynamo.reset()
        module = PositionalEncoding(8, max_len=64).eval()
        compiled = torch.compile(
            module, backend="eager", fullgraph=fullgraph, dynamic=dynamic
        )
        for offset in warm_up:
            assert torch.equal(compiled(x, offset=offset), module(x, offset=offset))
        with pytest.raises(
            Exception, match=r"offset must be an int (>= 0|in \[0, 2\*\*53\])"
        ) as info:
            compiled(x, offset=-10)
        assert isinstance(info.value, (ValueError, torch._dynamo.exc.Unsupported)), (
            dynamic,
            fullgraph,
        )
    torch._dynamo.reset()


@needs_compile
def test_compiled_tensor_offset_matches_eager() -> None:
    """A 0-d tensor offset under torch.compile, with and without ``fullgraph``: its value is not read while
    compiling (no graph break, no data-dependent branch), and the rows are those of the int offset, in the cache and
    past it."""
    x = torch.randn(3, 2, 8)
    for fullgraph in (True, False):
        torch._dynamo.reset()
        module = PositionalEncoding(8, max_len=64).eval()
        compiled = torch.compile(module, backend="eager", fullgraph=fullgraph)
        for offset in (5, 6, 70):
            assert torch.equal(
                compiled(x, offset=torch.tensor(offset)), module(x, offset=offset)
            ), offset
    torch._dynamo.reset()
