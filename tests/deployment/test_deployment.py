"""posenc deployed as people deploy models: every path either gives eager's result or refuses, naming posenc.

The cases and paths are those of tests/references/deployment_cases.py: each public module, wrapped to take tensors
only, is exported (torch.export strict and non-strict, saved and loaded; ONNX by the dynamo and the legacy
exporter, run in onnxruntime; an AOTInductor package), traced (torch.jit.trace), called under FakeTensorMode or on
the meta device and then for real, mapped by torch.func.vmap, and called on zero-size inputs. A path that works
gives eager's results: bitwise where eager is bitwise against itself (the same ATen kernels), to float32 rounding
through onnxruntime and AOTInductor (other sin/cos kernels). A path that cannot work raises, at export, trace or
call time, an error whose message names posenc. Nothing may export and then run wrong: each case's calls differ in
their values, so a program that baked an input in as a constant fails the second call.

The slow paths (ONNX, AOTInductor) are marked ``deploy``. The pairs that fail with torch 2.13 are listed, with the
error seen, in ``deployment_cases.KNOWN_FAILURES`` and marked ``xfail(strict=True)``: a fix makes them pass, and
the strict mark then fails until it is removed.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import posenc
from tests.references.deployment_cases import (
    CASE,
    CASES,
    KNOWN_FAILURES,
    PATHS,
    ROPE_PARAMETERS,
    Case,
    committed_outcomes,
    hf_config,
    padding_mask,
)

Program = Callable[..., Any]
POSENC = Path(posenc.__file__).parent
#: onnxruntime and inductor's kernels against ATen's: float32 rounding of values of magnitude ~1-4
FLOAT32 = {"rtol": 2.0**-20, "atol": 2.0**-20}


def flat(out: Any) -> list[Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def refusal(error: BaseException) -> BaseException | None:
    """The error, among ``error`` and those it was raised from, that names a public posenc name
    (``posenc.RotaryEmbedding``): a refusal, not a crash; None if none does. An internal name (the operator
    ``posenc::rotary_tables`` in an exporter's error) is not a refusal."""
    public = tuple(f"posenc.{name}" for name in posenc.__all__)
    seen: BaseException | None = error
    while seen is not None:
        if any(name in str(seen) for name in public):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def names_posenc(error: BaseException) -> bool:
    """Whether ``error`` or an error it was raised from names a public posenc name: a refusal."""
    return refusal(error) is not None


def posenc_words(error: BaseException) -> str:
    """The message of a refusal as posenc wrote it, without what an exporter or dynamo wrapped around it (a
    failure: its own message), on one line."""
    said = refusal(error)
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(said or error)).split())
    public = "|".join(re.escape(f"posenc.{name}") for name in posenc.__all__)
    start = re.search(rf"(?:{public})\b", text) if said else None
    if start is None:
        return text
    text = text[start.start() :]
    ends = [text.find(stop) for stop in ('")', " (Refer to", " For more details")]
    return text[: min([e for e in ends if e > 0], default=len(text))]


#: where `tools/deployment_table.py --record` collects what each (path, case) gave (one file per worker)
RECORD = os.environ.get("POSENC_DEPLOYMENT_RECORD")


def settle(
    path: str | None, name: str, outcome: str, error: BaseException | None = None
) -> None:
    """What a (path, case) gave: ``works``, ``refused`` (an error naming posenc), or, recorded only, ``fails``.

    Recording (``POSENC_DEPLOYMENT_RECORD``), it is written down for the support table; otherwise it must be what
    the committed table (``deployment_cases.OUTCOMES``) says, so that the table chapter 19 and the README print
    cannot drift from what the tests see. ``path`` None: a case outside the table (no record, no check)."""
    if path is None:
        return
    if RECORD:
        message = posenc_words(error) if error is not None else ""
        line = {"path": path, "case": name, "outcome": outcome, "message": message}
        with open(Path(RECORD) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        return
    seen = committed_outcomes().get((path, name), {}).get("outcome")
    assert seen == outcome, (
        f"{name} through {path}: {outcome}, the committed support table says {seen}; "
        "run `python tools/deployment_table.py --record` and read the change"
    )


def eager(case: Case, calls: list[tuple[Tensor, ...]]) -> list[list[Tensor]]:
    """A fresh eager module's results for ``calls``, in order."""
    module = case.build()
    return [[t.clone() for t in flat(module(*c))] for c in calls]


def assert_matches(
    got: list[list[Tensor]], want: list[list[Tensor]], exact: bool, where: str
) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w), f"{where}, call {i}: {len(g)} outputs, eager {len(w)}"
        for j, (a, b) in enumerate(zip(g, w)):
            a = torch.as_tensor(a)
            assert a.shape == b.shape and a.dtype == b.dtype, (
                f"{where}, call {i} output {j}: {a.dtype} {tuple(a.shape)}, "
                f"eager {b.dtype} {tuple(b.shape)}"
            )
            if exact:
                diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0
                assert torch.equal(a, b), (
                    f"{where}, call {i} output {j}: differs from eager by {diff}"
                )
            else:
                torch.testing.assert_close(
                    a, b, **FLOAT32, msg=lambda m: f"{where}: {m}"
                )


def deployed(
    case: Case,
    make: Callable[[Case, list[tuple[Tensor, ...]]], Program],
    exact: bool,
    path: str | None,
) -> None:
    """Deploy ``case`` with ``make`` and run its calls: eager's results, or an error naming posenc."""
    calls = case.calls()
    want = eager(case, calls)
    try:
        program = make(case, calls)
        got = [[torch.as_tensor(t) for t in flat(program(*c))] for c in calls]
    except Exception as error:
        if names_posenc(error):
            return settle(path, case.name, "refused", error)  # refused, and says so
        if RECORD:
            settle(path, case.name, "fails", error)
        raise
    try:
        assert_matches(got, want, exact, f"{case.name} deployed")
    except AssertionError as error:
        if RECORD:
            settle(path, case.name, "fails", error)
        raise
    settle(path, case.name, "works")


def known_params(
    names: Any, known: dict[Any, str], path: str | None = None
) -> list[Any]:
    """One param per name, marked xfail(strict=True) with its reason where ``known`` lists it (by name, or by
    ``(path, name)``)."""
    out = []
    for name in names:
        reason = known.get(name if path is None else (path, name))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def params(path: str, cases: tuple[Case, ...] = CASES) -> list[Any]:
    return known_params([case.name for case in cases], KNOWN_FAILURES, path)


def dynamic_shapes(case: Case) -> tuple[Any, ...] | None:
    if case.dynamic is None:
        return None
    seq = torch.export.Dim("seq", min=2, max=64)
    return tuple(None if axis is None else {axis: seq} for axis in case.dynamic)


# --- torch.export -------------------------------------------------------------------------------------------


def exported(case: Case, calls: list[tuple[Tensor, ...]], strict: bool) -> Any:
    return torch.export.export(
        case.build(), calls[0], dynamic_shapes=dynamic_shapes(case), strict=strict
    )


@pytest.mark.parametrize("name", params("export"))
def test_export_non_strict(name: str) -> None:
    make = lambda c, calls: exported(c, calls, False).module()  # noqa: E731
    deployed(CASE[name], make, True, "export")


@pytest.mark.parametrize("name", params("export_strict"))
def test_export_strict(name: str) -> None:
    make = lambda c, calls: exported(c, calls, True).module()  # noqa: E731
    deployed(CASE[name], make, True, "export_strict")


@pytest.mark.parametrize("name", params("export_saved"))
def test_export_saved_and_loaded(name: str, tmp_path: Path) -> None:
    def make(case: Case, calls: list[tuple[Tensor, ...]]) -> Program:
        torch.export.save(exported(case, calls, False), tmp_path / "program.pt2")
        return torch.export.load(tmp_path / "program.pt2").module()

    deployed(CASE[name], make, True, "export_saved")


# --- ONNX, run in onnxruntime -----------------------------------------------------------------------------------


def onnx_program(path: Path, defaults: dict[str, Any] | None = None) -> Program:
    """The ONNX file at ``path`` in an onnxruntime session, called with the module's inputs (those the exporter
    kept, by name: an input the program does not read is dropped). ``defaults``: forward's parameters that the
    legacy exporter added as inputs (``offset.1``: the default of each parameter after the given arguments, which
    it passes positionally), fed their default values as a user of the file would."""
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    kept = [i.name for i in session.get_inputs()]
    added = {
        k: np.asarray(defaults[k.split(".")[0]]) for k in kept if "." in k and defaults
    }

    def run(*args: Tensor) -> list[Any]:
        feed = {f"input_{i}": a.numpy() for i, a in enumerate(args)} | added
        return [
            torch.from_numpy(o) for o in session.run(None, {k: feed[k] for k in kept})
        ]

    return run


def input_names(calls: list[tuple[Tensor, ...]]) -> list[str]:
    return [f"input_{i}" for i in range(len(calls[0]))]


@pytest.mark.deploy
@pytest.mark.parametrize("name", params("onnx"))
def test_onnx_dynamo_export_in_onnxruntime(name: str, tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")

    def make(case: Case, calls: list[tuple[Tensor, ...]]) -> Program:
        torch.onnx.export(
            case.build(), calls[0], str(tmp_path / "model.onnx"), dynamo=True,
            input_names=input_names(calls), dynamic_shapes=dynamic_shapes(case),
            external_data=False, verbose=False,
        )  # fmt: skip
        return onnx_program(tmp_path / "model.onnx")

    deployed(CASE[name], make, False, "onnx")


class Inside(nn.Module):
    """A model whose forward passes its tensors on to ``module``: how a model holding posenc's module is
    exported."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *inputs: Tensor) -> Any:
        return self.module(*inputs)


def onnx_legacy(
    inside: bool, tmp_path: Path
) -> Callable[[Case, list[tuple[Tensor, ...]]], Program]:
    def make(case: Case, calls: list[tuple[Tensor, ...]]) -> Program:
        names = input_names(calls)
        axes = None
        if case.dynamic is not None:
            axes = {n: [a] for n, a in zip(names, case.dynamic) if a is not None}
        module = Inside(case.build()) if inside else case.build()
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # the legacy exporter's deprecation notice, TracerWarnings
            torch.onnx.export(
                module, calls[0], str(tmp_path / "model.onnx"), dynamo=False,
                input_names=names, dynamic_axes=axes,
            )  # fmt: skip
        parameters = inspect.signature(module.forward).parameters.values()
        defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
        return onnx_program(tmp_path / "model.onnx", defaults)

    return make


@pytest.mark.deploy
@pytest.mark.parametrize("name", params("onnx_legacy"))
def test_onnx_legacy_export_in_onnxruntime(name: str, tmp_path: Path) -> None:
    deployed(CASE[name], onnx_legacy(False, tmp_path), False, "onnx_legacy")


@pytest.mark.deploy
@pytest.mark.parametrize("name", params("onnx_legacy_inside"))
def test_onnx_legacy_export_inside_a_model(name: str, tmp_path: Path) -> None:
    deployed(CASE[name], onnx_legacy(True, tmp_path), False, "onnx_legacy_inside")


@pytest.mark.deploy
def test_legacy_onnx_takes_positional_encodings_offset_as_an_input(
    tmp_path: Path,
) -> None:
    """The legacy exporter, given PositionalEncoding as the whole model, makes forward's ``offset`` an input of
    the file (the README says so): fed 3, the program adds the rows of positions 3 .. 7, as eager mode does; the
    rotary module's int ``offset`` and ``seq_dim`` are fixed in its file, which has only q and k as inputs."""
    pytest.importorskip("onnxruntime")
    module, x = posenc.PositionalEncoding(16, max_len=32).eval(), torch.randn(5, 2, 16)
    rope, q = posenc.RotaryEmbedding(16), torch.randn(1, 2, 5, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(tmp_path / "pe.onnx"), dynamo=False)
        torch.onnx.export(rope, (q, q), str(tmp_path / "rope.onnx"), dynamo=False)
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(tmp_path / "pe.onnx"), providers=["CPUExecutionProvider"]
    )
    x_name, offset_name = (i.name for i in session.get_inputs())
    assert offset_name.startswith("offset")
    for offset in (0, 3):
        (y,) = session.run(None, {x_name: x.numpy(), offset_name: np.asarray(offset)})
        torch.testing.assert_close(
            torch.from_numpy(y), module(x, offset=offset), atol=6e-8, rtol=0
        )
    session = ort.InferenceSession(
        str(tmp_path / "rope.onnx"), providers=["CPUExecutionProvider"]
    )
    assert len(session.get_inputs()) == 2


@pytest.mark.deploy
def test_legacy_onnx_passes_keyword_only_defaults_positionally(tmp_path: Path) -> None:
    """Why no public forward of posenc has a keyword-only parameter: torch 2.13's legacy exporter
    (its _decide_input_format) passes the default of each one as one more positional argument, so such a forward
    raises TypeError, shown here on a module with nothing of posenc's. When torch fixes it, this test fails."""

    class KeywordOnly(nn.Module):
        def forward(self, x: Tensor, *, shift: int = 0) -> Tensor:
            return x + shift

    with (
        warnings.catch_warnings(),
        pytest.raises(TypeError, match="positional argument"),
    ):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            KeywordOnly(), (torch.zeros(2),), str(tmp_path / "m.onnx"), dynamo=False
        )


# --- AOTInductor --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private TORCHINDUCTOR_CACHE_DIR for this session's AOTInductor packages (and a C++ compiler, or a skip
    saying how to install one)."""
    if (
        shutil.which(os.environ.get("CXX", "c++")) is None
        and shutil.which("g++") is None
    ):
        pytest.skip("AOTInductor needs a C++ compiler: apt-get install -y g++")
    path = tmp_path_factory.mktemp("inductor")
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    yield path
    if before is None:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


@pytest.mark.deploy
@pytest.mark.parametrize("name", params("aoti"))
def test_aot_inductor_package(name: str, tmp_path: Path, inductor_cache: Path) -> None:
    def make(case: Case, calls: list[tuple[Tensor, ...]]) -> Program:
        package = torch._inductor.aoti_compile_and_package(
            exported(case, calls, False), package_path=str(tmp_path / "model.pt2")
        )
        return torch._inductor.aoti_load_package(package)

    deployed(CASE[name], make, False, "aoti")


# --- torch.jit.trace ----------------------------------------------------------------------------------------------


def traced(case: Case, calls: list[tuple[Tensor, ...]]) -> Program:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return torch.jit.trace(case.build(), calls[0])


@pytest.mark.parametrize("name", params("jit_trace"))
def test_jit_trace(name: str) -> None:
    deployed(CASE[name], traced, True, "jit_trace")


LONGER = {  # traced at one length, called at another (past max_len where a table is cached)
    "PositionalEncoding past max_len": (
        lambda: posenc.PositionalEncoding(16, max_len=8).eval(),
        [(torch.randn(6, 2, 16),), (torch.randn(20, 2, 16),)],
    ),
    "PositionalEncoding within max_len": (
        lambda: posenc.PositionalEncoding(16, max_len=32).eval(),
        [(torch.randn(6, 2, 16),), (torch.randn(10, 2, 16),)],
    ),
    "RotaryEmbedding past max_len": (
        lambda: posenc.RotaryEmbedding(16, max_len=8),
        [(torch.randn(1, 2, n, 16), torch.randn(1, 2, n, 16)) for n in (6, 20)],
    ),
}
#: (path, case) -> what fails (none): the legacy exporter runs a model whose forward calls the module (Inside),
#: as models hold posenc's modules
LONGER_KNOWN: dict[tuple[str, str], str] = {}


def longer_params(path: str) -> list[Any]:
    return known_params(LONGER, LONGER_KNOWN, path)


@pytest.mark.parametrize("name", longer_params("jit_trace"))
def test_jit_trace_called_at_another_length(name: str) -> None:
    build, calls = LONGER[name]
    case = Case(name, build, lambda: calls)
    deployed(case, traced, True, None)


@pytest.mark.deploy
@pytest.mark.parametrize("name", longer_params("onnx_legacy"))
def test_onnx_legacy_dynamic_axes_at_another_length(name: str, tmp_path: Path) -> None:
    build, calls = LONGER[name]
    case = Case(name, build, lambda: calls)

    def make(case: Case, calls: list[tuple[Tensor, ...]]) -> Program:
        names = input_names(calls)
        axis = 0 if len(calls[0]) == 1 else 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                Inside(case.build()), calls[0], str(tmp_path / "model.onnx"),
                dynamo=False, input_names=names, dynamic_axes={n: [axis] for n in names},
            )  # fmt: skip
        return onnx_program(tmp_path / "model.onnx")

    deployed(case, make, False, None)


# --- FakeTensorMode and the meta device, then real use --------------------------------------------------------


def then_real(
    case: Case, first: Callable[[nn.Module, tuple[Tensor, ...]], Any], path: str
) -> None:
    """``first(module, inputs)`` (a fake or meta use, which may refuse naming posenc), then the real calls:
    eager's results, bitwise."""
    calls = case.calls()
    want = eager(case, calls)
    module = case.build()
    refusal = None
    try:
        module = first(module, calls[0]) or module
    except Exception as error:
        if not names_posenc(error):
            raise
        refusal = error
    got = [[t.clone() for t in flat(module(*c))] for c in calls]
    for outputs in got:
        for t in outputs:
            assert type(t) is Tensor and t.device.type == "cpu", (
                f"{case.name}: a real call returned {type(t).__name__} on {t.device}"
            )
    assert_matches(got, want, True, f"{case.name}, real calls after")
    settle(path, case.name, "refused" if refusal else "works", refusal)


@pytest.mark.parametrize("name", params("fake"))
def test_fake_call_then_real(name: str) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    def first(module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        want = [t.shape for t in flat(case.build()(*inputs))]
        # a planner's mode: the module's own real tensors (buffers, tables) are faked as they are met
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            out = flat(module(*(mode.from_tensor(t) for t in inputs)))
            assert [t.shape for t in out] == want

    case = CASE[name]
    then_real(case, first, "fake")


@pytest.mark.parametrize("name", params("meta_built"))
def test_built_on_meta_then_to_empty(name: str) -> None:
    case = CASE[name]

    def first(module: nn.Module, inputs: tuple[Tensor, ...]) -> nn.Module:
        with torch.device("meta"):
            module = case.build()
        return module.to_empty(device="cpu")

    then_real(case, first, "meta_built")


@pytest.mark.parametrize("name", params("meta_call"))
def test_meta_call_then_real(name: str) -> None:
    def first(module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        out = flat(module(*(t.to("meta") for t in inputs)))
        assert all(t.device.type == "meta" for t in out)

    then_real(CASE[name], first, "meta_call")


@pytest.mark.parametrize("name", params("to_meta"))
def test_to_meta_then_to_empty(name: str) -> None:
    def first(module: nn.Module, inputs: tuple[Tensor, ...]) -> nn.Module:
        return module.to("meta").to_empty(device="cpu")

    then_real(CASE[name], first, "to_meta")


@pytest.mark.parametrize("name", params("meta_context"))
def test_first_call_in_meta_context_then_real(name: str) -> None:
    def first(module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        with torch.device("meta"):
            module(*(t.to("meta") for t in inputs))

    then_real(CASE[name], first, "meta_context")


# --- torch.func.vmap against a per-sample loop ------------------------------------------------------------------


def _per_sample_positions() -> Tensor:
    return torch.stack([torch.randperm(12)[:6] for _ in range(3)])  # [3, 6]


def _rotate_at(rope: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
    """``rope.rotate(x, positions=p)`` as a function of ``(x, p)``."""
    return lambda x, p: rope.rotate(x, positions=p)


def _called_at(module: nn.Module) -> Callable[[Tensor], Any]:
    """An HF rotary module as a function of its position ids alone."""
    return lambda ids: module(torch.zeros(1), ids)


VMAP: dict[str, Callable[[], tuple[Callable[..., Any], tuple[Tensor, ...]]]] = {
    "PositionalEncoding": lambda: (
        posenc.PositionalEncoding(16, max_len=32).eval(),
        (torch.randn(3, 6, 2, 16),),
    ),
    "RotaryEmbedding.rotate(positions=)": lambda: (
        _rotate_at(posenc.RotaryEmbedding(16, max_len=32)),
        (torch.randn(3, 2, 6, 16), _per_sample_positions()),
    ),
    "RotaryEmbedding": lambda: (
        posenc.RotaryEmbedding(16, max_len=32),
        (torch.randn(3, 2, 6, 16), torch.randn(3, 2, 6, 16)),
    ),
    "apply_rotary": lambda: (
        posenc.apply_rotary,
        (torch.randn(3, 2, 6, 16), _per_sample_positions()),
    ),
    "rotary_cos_sin": lambda: (
        lambda p: posenc.rotary_cos_sin(p, 16),
        (_per_sample_positions(),),
    ),
    "offset_matrix": lambda: (
        lambda k: posenc.offset_matrix(k, 16),
        (torch.tensor([0, 3, 7]),),
    ),
    "timestep_embedding": lambda: (
        lambda t: posenc.timestep_embedding(t, 16),
        (torch.rand(3, 4) * 1000,),
    ),
    "Timesteps": lambda: (posenc.Timesteps(16), (torch.rand(3, 4) * 1000,)),
    "detr_sine_encoding": lambda: (
        lambda m: posenc.detr_sine_encoding(m, 8, normalize=True),
        (torch.stack([padding_mask(1, 3, 4, seed=s) for s in range(3)]),),
    ),
    **{
        f"HFRotaryEmbedding[{t}]": lambda t=t: (
            _called_at(posenc.HFRotaryEmbedding(hf_config(t))),
            (_per_sample_positions()[:, None],),
        )
        for t in ROPE_PARAMETERS
    },
}
#: functions that vmap cannot batch today (none)
VMAP_KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("name", known_params(VMAP, VMAP_KNOWN))
def test_vmap_matches_a_per_sample_loop(name: str) -> None:
    fn, inputs = VMAP[name]()
    loop = [flat(fn(*(t[i] for t in inputs))) for i in range(inputs[0].shape[0])]
    want = [torch.stack(outs) for outs in zip(*loop)]
    try:
        got = flat(torch.func.vmap(fn)(*inputs))
    except Exception as error:
        if names_posenc(error):
            return settle("vmap", name, "refused", error)
        raise
    assert_matches([got], [want], True, f"vmap of {name}")
    settle("vmap", name, "works")


def test_vmap_of_dynamic_ntk_is_refused_and_leaves_the_state_alone() -> None:
    # dynamic NTK's tables depend on the calls before: vmap's per-sample calls cannot update one state as a loop
    # of calls would, so the call is refused, naming posenc, and the module's state is what it was
    mapped, fresh = (posenc.HFRotaryEmbedding(hf_config("dynamic")) for _ in "ab")
    x, ids = torch.zeros(1), torch.arange(40).expand(3, 1, 40)
    with pytest.raises(NotImplementedError, match=r"torch\.func\.vmap") as refused:
        torch.func.vmap(mapped, in_dims=(None, 0))(x, ids)
    assert names_posenc(refused.value)
    for n in (20, 50, 10):
        ids = torch.arange(n)[None]
        assert_matches(
            [flat(mapped(x, ids))], [flat(fresh(x, ids))], True, f"a call of {n} after"
        )


# --- zero-size inputs ---------------------------------------------------------------------------------------------


def _hf(rope_type: str) -> Callable[[Tensor], Any]:
    module = posenc.HFRotaryEmbedding(hf_config(rope_type))
    return lambda ids: module(torch.zeros(1), ids)


ZERO: dict[str, tuple[Callable[[], Any], list[tuple[int, ...]]]] = {
    # name: (a call, the shape of each output)
    "PositionalEncoding seq 0": (
        lambda: posenc.PositionalEncoding(16)(torch.zeros(0, 2, 16)),
        [(0, 2, 16)],
    ),
    "PositionalEncoding batch 0": (
        lambda: posenc.PositionalEncoding(16)(torch.zeros(6, 0, 16)),
        [(6, 0, 16)],
    ),
    "RotaryEmbedding seq 0": (
        lambda: posenc.RotaryEmbedding(16)(*[torch.zeros(1, 2, 0, 16)] * 2),
        [(1, 2, 0, 16)] * 2,
    ),
    "RotaryEmbedding positions 0": (
        lambda: posenc.RotaryEmbedding(16).rotate(
            torch.zeros(1, 2, 0, 16), positions=torch.zeros(0, dtype=torch.long)
        ),
        [(1, 2, 0, 16)],
    ),
    "apply_rotary seq 0": (
        lambda: posenc.apply_rotary(torch.zeros(1, 2, 0, 16)),
        [(1, 2, 0, 16)],
    ),
    "rotary_cos_sin 0": (lambda: posenc.rotary_cos_sin(0, 16), [(0, 16)] * 2),
    "rotary_cos_sin empty tensor": (
        lambda: posenc.rotary_cos_sin(torch.zeros(0, dtype=torch.long), 16),
        [(0, 16)] * 2,
    ),
    **{
        f"HFRotaryEmbedding[{t}] seq 0": (
            lambda t=t: _hf(t)(torch.zeros(1, 0, dtype=torch.long)),
            [(1, 0, 16)] * 2,
        )
        for t in ("default", "dynamic", "longrope")
    },
    "Timesteps 0": (lambda: posenc.Timesteps(16)(torch.zeros(0)), [(0, 16)]),
    "timestep_embedding 0": (
        lambda: posenc.timestep_embedding(torch.zeros(0), 16),
        [(0, 16)],
    ),
    "sincos_grid height 0": (lambda: posenc.sincos_grid((0, 3), 16), [(0, 16)]),
    **{
        f"detr_sine_encoding mask {shape}": (
            lambda shape=shape: posenc.detr_sine_encoding(
                torch.zeros(shape, dtype=torch.bool), 8
            ),
            [(shape[0], 16, *shape[1:])],
        )
        for shape in ((0, 3, 4), (2, 0, 4), (2, 3, 0))
    },
    **{
        f"PositionEmbeddingSine mask {shape}": (
            lambda shape=shape: posenc.PositionEmbeddingSine(8, normalize=True)(
                torch.zeros(shape, dtype=torch.bool)
            ),
            [(shape[0], 16, *shape[1:])],
        )
        for shape in ((0, 3, 4), (2, 0, 4), (2, 3, 0))
    },
}
#: zero-size inputs that fail today (none)
ZERO_KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("name", known_params(ZERO, ZERO_KNOWN))
def test_zero_size_inputs_give_empty_results(name: str) -> None:
    # an empty result, or posenc's own argument error (a ValueError raised by posenc's checks, naming the fix)
    call, shapes = ZERO[name]
    try:
        out = flat(call())
    except ValueError as error:
        frames = traceback.extract_tb(error.__traceback__)
        assert Path(frames[-1].filename).is_relative_to(POSENC), error
        return
    assert [tuple(t.shape) for t in out] == shapes


# --- the support table ----------------------------------------------------------------------------------------------


def test_the_committed_table_covers_every_case_and_path() -> None:
    """Every (path, case) the tests run is in the committed table, and what it says fails is what
    KNOWN_FAILURES lists (the xfails), no more, no less."""
    if RECORD:
        pytest.skip("the table is being recorded")
    table = committed_outcomes()
    wanted = {(path, case.name) for path in PATHS for case in CASES}
    wanted |= {("vmap", name) for name in VMAP}
    assert wanted <= set(table), sorted(wanted - set(table))[:5]
    failing = {key for key, entry in table.items() if entry["outcome"] == "fails"}
    assert failing == set(KNOWN_FAILURES)


def test_the_readme_prints_the_committed_table() -> None:
    from tests.references.deployment_cases import support_table

    if RECORD:
        pytest.skip("the table is being recorded")
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(
        encoding="utf-8"
    )
    assert support_table(committed_outcomes()) in readme, (
        "README.md's deployment table is not the committed one: "
        "run `python tools/deployment_table.py --readme`"
    )
