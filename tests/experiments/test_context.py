"""The context-extension experiment (experiments/context, chapter 09): its text, its scalings, its sweep.

- the corpus is mpmath's source as pinned, split by file, identified by SHA-256;
- every method's rotary embedding is posenc's, set from the ``rope_parameters`` a transformers config carries, and
  its frequencies and attention factor are transformers' own for that config (a wrong scaling fails here);
- the quick sweep (what CI runs) writes a well-formed file whose runs reproduce bit for bit, and a changed record
  is caught; the full sweep refuses uncommitted code;
- the committed results file (when present) is well formed, ran on the pinned kernels, names its commit, and its
  kept base models are the recorded ones.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from experiments.context import __main__ as cli
from experiments.context import data
from experiments.context import sweep as sw
from experiments.context.model import (
    METHODS,
    ModelConfig,
    llama_config,
    rope_parameters,
    rotary,
)
from experiments.context.train import RunConfig
from experiments.position import cpu

ROOT = Path(__file__).resolve().parents[2]
RESULTS = cli.DEFAULT


def test_the_corpus_is_the_pinned_package_split_by_file():
    corpus = data.load()
    assert set(corpus.train_files).isdisjoint(corpus.held_out_files)
    names = sorted(corpus.train_files + corpus.held_out_files)
    assert list(corpus.held_out_files) == names[:: data.HELD_OUT_EVERY]
    assert (
        corpus.train.dtype == torch.int64 and int(corpus.train.max()) < data.VOCAB_SIZE
    )
    # the SHA-256 is of the files joined by one newline, in path order
    import mpmath

    package = Path(mpmath.__file__).resolve().parent
    joined = b"\n".join((package / n).read_bytes() for n in names)
    assert (
        hashlib.sha256(joined).hexdigest()
        == corpus.sha256
        == data.identity(corpus)["sha256"]
    )
    assert corpus.train.numel() + corpus.held_out.numel() + 1 == len(
        joined
    )  # one joining newline between splits


def test_windows_are_the_same_for_every_call_and_batches_follow_the_generator():
    text = torch.arange(1000)
    a, b = data.windows(text, 7, 64), data.windows(text, 7, 64)
    assert a.shape == (7, 65) and torch.equal(a, b)
    assert torch.equal(a[:, 1:] - a[:, :-1], torch.ones(7, 64, dtype=torch.int64))
    one = data.batch(text, 5, 32, torch.Generator().manual_seed(3))
    two = data.batch(text, 5, 32, torch.Generator().manual_seed(3))
    assert torch.equal(one, two)
    with pytest.raises(ValueError, match="too short"):
        data.windows(torch.arange(50), 40, 32)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_is_transformers_scaling_computed_by_posenc(method):
    # posenc's frequencies for the config are transformers' own inv_freq (and attention factor)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model, context, factor = ModelConfig(), 64, 4
    hf = llama_config(model, method, context, factor)
    kind = hf.rope_parameters["rope_type"]
    assert hf.rope_parameters == rope_parameters(method, context, factor)
    for length in (context, factor * context, 2 * factor * context):
        ours = rotary(model, method, context, factor, length)
        cos, _ = ours.cos_sin(torch.arange(length)[None])
        if kind == "default":
            inv_freq = 1.0 / (
                10000.0
                ** (torch.arange(0, model.head_dim, 2).double() / model.head_dim)
            )
            attention = 1.0
        else:
            kwargs = {"seq_len": length} if kind == "dynamic" else {}
            inv_freq, attention = ROPE_INIT_FUNCTIONS[kind](hf, "cpu", **kwargs)
            if kind == "dynamic" and length <= context:
                inv_freq = 1.0 / (
                    10000.0
                    ** (torch.arange(0, model.head_dim, 2).double() / model.head_dim)
                )
        angles = torch.arange(length).double()[:, None] * inv_freq.double()[None]
        theirs = (torch.cat([angles, angles], -1).cos() * attention)[None]
        assert cos.shape == theirs.shape
        assert (cos.double() - theirs).abs().max() <= 2e-5 * max(1.0, length / 64), (
            method,
            length,
        )


def test_bad_methods_and_settings_are_named():
    with pytest.raises(ValueError, match="method must be one of"):
        rope_parameters("ntk", 64, 4)
    with pytest.raises(
        ValueError, match="batch_size=30 must be a multiple of factor=4"
    ):
        RunConfig(batch_size=30)
    with pytest.raises(ValueError, match="bucket=7 must divide context=64"):
        RunConfig(bucket=7)


def test_the_quick_sweep_is_pinned_and_reproduces_bit_for_bit(tmp_path, capsys):
    out = tmp_path / "quick.json"
    assert cli.main(["--quick", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert sw.check_schema(results) == []
    assert out.read_text() == sw.dumps(results)
    assert [(r["stage"], r["method"]) for r in results["runs"]] == [("base", None)] + [
        ("finetune", m) for m in METHODS
    ]
    assert (tmp_path / sw.weights_name(0)).exists()
    # every loss is a loss: positive, finite, below the uniform guess's ln 256 after training
    for stage in results["summary"].values():
        for per in stage.values():
            for s in per.values():
                assert 0 < s["mean"] < math.log(256) and len(s["buckets"]) > 0
    assert results["machine"]["env"] == cpu.PINNED
    capsys.readouterr()
    # a base run and a fine-tune re-run bit for bit; a changed record is caught
    assert cli.main(["--reproduce", "6", "--out", str(out)]) == 0
    assert "6 of 6 runs reproduced bit for bit" in capsys.readouterr().out
    results["runs"][2]["results"]["1"]["loss"] += 1e-6
    out.write_text(sw.dumps(results))
    assert cli.main(["--reproduce", "6", "--out", str(out)]) == 1
    assert "DIFFERENT" in capsys.readouterr().out
    assert any("summary" in p for p in sw.check_schema(results))
    assert any(
        "runs" in p for p in sw.check_schema({**results, "runs": results["runs"][1:]})
    )


def test_the_full_sweep_refuses_uncommitted_code(monkeypatch, capsys):
    for dirty, used in (
        (["experiments/context/train.py"], []),
        ([], ["posenc/rotary/rotation.py"]),
    ):
        monkeypatch.setattr(
            sw,
            "provenance",
            lambda d=dirty, u=used: {"commit": "0" * 40, "dirty": d, "used_dirty": u},
        )
        monkeypatch.setattr(
            sw, "sweep", lambda *a, **k: pytest.fail("the sweep started")
        )
        with pytest.raises(SystemExit):
            cli.main([])
        message = capsys.readouterr().err
        assert (dirty + used)[0] in message and "--allow-dirty" in message


needs_results = pytest.mark.skipif(
    not RESULTS.exists(), reason=f"no committed results at {RESULTS.name}"
)


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads(RESULTS.read_text())


@needs_results
def test_the_committed_results_are_well_formed_and_pinned(results):
    assert sw.check_schema(results) == []
    assert RESULTS.read_text() == sw.dumps(results)
    assert results["machine"]["env"] == cpu.PINNED
    assert results["machine"]["cpu_capability"] == [cpu.EXPECTED_CAPABILITY]
    assert len(results["seeds"]) >= 5 and results["settings"] == sw.settings(sw.FULL)
    assert results["code"]["dirty"] == [] and results["code"]["used_dirty"] == []
    assert results["data"] == data.identity(data.load())
    assert results["rope_parameters"] == {
        m: rope_parameters(m, sw.FULL.context, sw.FULL.factor) for m in METHODS
    }


@needs_results
def test_the_kept_base_models_are_the_recorded_runs(results):
    from experiments.context.train import weights_digest

    for r in results["runs"]:
        if r["stage"] != "base":
            continue
        path = RESULTS.parent / sw.weights_name(r["seed"])
        from experiments.context.model import ByteLM

        model = ByteLM(
            sw.FULL.model,
            rotary(sw.FULL.model, "none", sw.FULL.context, 1, sw.FULL.context),
        )
        model.load_state_dict(torch.load(path, weights_only=True))
        assert weights_digest(model) == r["weights_sha256"]


def test_a_stopped_sweep_resumes_from_its_checkpoint(tmp_path):
    # in this process (workers=0): one seed's base run and five fine-tunes of the quick settings
    from experiments.position.sweep import comparable

    check = tmp_path / "runs.jsonl"

    def again() -> dict:
        return sw.sweep(
            sw.QUICK, (0,), tmp_path, workers=0, checkpoint=check, log=lambda line: None
        )

    first = again()
    lines = check.read_text().splitlines()
    assert len(lines) == 1 + len(METHODS)
    # a sweep killed while writing its last line: that run is run again, the others are not
    check.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    second = again()
    assert (first["resumed_runs"], second["resumed_runs"]) == (0, len(METHODS))
    assert sw.check_schema(second) == []
    assert [comparable(r) for r in first["runs"]] == [
        comparable(r) for r in second["runs"]
    ]
    # a base run whose saved weights are gone is run again (its fine-tunes load them)
    (tmp_path / sw.weights_name(0)).unlink()
    assert again()["resumed_runs"] == len(METHODS)
