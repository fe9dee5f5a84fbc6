"""The "does position matter?" harness (experiments/position, book/08_position_matters.ipynb).

Quick checks only (well under a minute on a 2-core CPU): one scheme learns copy inside its training lengths, a
seed fixes the result, every scheme runs past the training length (the learned table raises its documented
error), incremental decoding computes what a full forward pass computes, the teacher-forced scores are greedy
decoding's, first errors are classified as documented, the bootstrap interval and the two-stage seed rule do
what the chapter says, the full sweep refuses uncommitted harness code, and the committed results file matches
its schema, records the commit of the code that produced it and keeps its own rules (ten seeds where the first
five disagree). The chapter states no result by hand: its numbers are printed by code cells that read that file.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import asdict, replace
from pathlib import Path

import nbformat
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.position import sweep as sw
from experiments.position import tasks
from experiments.position.model import (
    SCHEMES,
    KVCache,
    ModelConfig,
    PositionOutOfRange,
    TinyDecoder,
    alibi_slopes,
    random_positions,
)
from experiments.position.train import (
    ERRORS,
    _head_statistics,
    evaluate,
    greedy_answers,
    run,
    score_rows,
    train,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results" / "position-matters-cpu.json"
CHAPTER = ROOT / "book" / "08_position_matters.ipynb"
SMALL = ModelConfig(
    scheme="none", d_model=16, n_heads=2, n_layers=2, d_ff=32, max_positions=14
)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.endswith("_seconds")}


def test_quick_mode_learns_copy_inside_the_training_lengths():
    # sinusoidal, copy, L = 6, 250 steps of 32 examples: a few seconds
    record = run("sinusoidal", "copy", 0, sw.QUICK)
    assert record["lengths"] == list(range(1, 13))
    exact, total = sw.window_count(record, "exact", 1, 6)
    assert exact / total >= 0.9, record["exact"]
    # the learning curve ends at the last step, on the validation set (lengths 1..L)
    assert record["curve"]["steps"] == list(range(50, 251, 50))
    assert record["curve"]["exact"][-1] >= 0.8


def test_same_seed_same_result():
    config = replace(sw.QUICK, steps=20)
    first = run("rotary", "reverse", 3, config)
    second = run("rotary", "reverse", 3, config)
    assert _without_timings(first) == _without_timings(second)
    other = run("rotary", "reverse", 4, config)
    assert _without_timings(other) != _without_timings(first)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_runs_past_the_training_length(scheme):
    torch.manual_seed(0)
    model = TinyDecoder(replace(SMALL, scheme=scheme)).eval()
    tokens = torch.randint(0, SMALL.vocab_size, (2, 3 * SMALL.max_positions))
    if scheme == "learned":
        assert model(tokens[:, : SMALL.max_positions]).shape == (
            2,
            14,
            SMALL.vocab_size,
        )
        with pytest.raises(
            PositionOutOfRange, match=r"14 rows .* got position 41.*evaluate"
        ):
            model(tokens)
        assert issubclass(PositionOutOfRange, ValueError)
    else:
        logits = model(tokens)
        assert logits.shape == (2, 42, SMALL.vocab_size)
        assert torch.isfinite(logits).all()


def test_learned_lengths_past_the_table_are_recorded_as_not_defined():
    config = replace(sw.QUICK, steps=1, eval_samples=4)
    record = run("learned", "copy", 0, config)
    # the table covers 2L + 2 tokens: inputs up to n = L = 6
    for key in ("exact", "tokens", "first", *ERRORS):
        assert [v is not None for v in record[key]] == [
            n <= 6 for n in record["lengths"]
        ]
    assert record["probe"]["source_weight"][6:] == [None] * 6


@pytest.mark.parametrize("scheme", SCHEMES)
def test_incremental_decoding_with_left_padding_matches_a_full_forward_pass(scheme):
    torch.manual_seed(1)
    model = TinyDecoder(replace(SMALL, scheme=scheme)).eval()
    tokens = torch.randint(0, SMALL.vocab_size, (3, 12))
    positions = torch.arange(12).expand(3, -1)
    if scheme == "sinusoidal_random":
        positions = random_positions(torch.full((3,), 12), 12, 64, torch.Generator())
    with torch.no_grad():
        full = model(tokens, positions)
        # row 0 again, left-padded by 3, fed as a prompt of 7 then one token at a time
        pad = 3
        padded = torch.cat([torch.zeros(1, pad, dtype=torch.long), tokens[:1]], dim=1)
        pos = torch.cat([torch.zeros(1, pad, dtype=torch.long), positions[:1]], dim=1)
        valid = torch.arange(pad + 12)[None] >= pad
        cache = KVCache(capacity=pad + 12)
        steps = [
            model(padded[:, : pad + 7], pos[:, : pad + 7], cache, valid[:, : pad + 7])
        ]
        for t in range(pad + 7, pad + 12):
            steps.append(model(padded[:, t : t + 1], pos[:, t : t + 1], cache))
        incremental = torch.cat(steps, dim=1)[:, pad:]
    torch.testing.assert_close(incremental, full[:1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", ["alibi", "sinusoidal_random"])
def test_teacher_forced_scores_are_greedy_decodings(scheme):
    # the chapter's exact match and first-error split are teacher-forced; greedy decoding
    # (the model fed its own outputs) must give the same verdict on every example
    torch.manual_seed(0)
    config = replace(sw.QUICK, steps=60, eval_samples=16)
    model = TinyDecoder(config.model_config(scheme))
    train(model, "copy", config, torch.Generator().manual_seed(0), torch.device("cpu"))
    result = evaluate(model, "copy", config, seed=5, device=torch.device("cpu"))
    assert result["greedy_check"] == {"lengths": [6, 7, 12], "disagreements": 0}
    data_generator = torch.Generator().manual_seed(10_000 + 5)
    data = {n: tasks.examples("copy", n, 16, data_generator) for n in result["lengths"]}
    position_generator = torch.Generator().manual_seed(20_000 + 5)
    for i, n in enumerate(result["lengths"]):
        seqs = data[n]
        positions = torch.arange(2 * n + 2).expand(16, -1)
        if scheme == "sinusoidal_random":
            positions = random_positions(
                torch.full((16,), 2 * n + 2), 2 * n + 2, 256, position_generator
            )
        generated = greedy_answers(
            model,
            seqs[:, : n + 2],
            torch.ones(16, n + 2, dtype=torch.bool),
            positions,
            n + 1,
        )
        target = seqs[:, n + 2 :]
        again = score_rows(
            generated,
            target,
            torch.ones_like(target, dtype=torch.bool),
            torch.full((16,), n),
        )
        for key in ("exact", *ERRORS):
            assert int(again[key].sum()) == result[key][i], (n, key)
        assert int((generated[:, 0] == target[:, 0]).sum()) == result["first"][i]


def test_first_errors_are_classified_by_the_first_wrong_token():
    E, a, b = tasks.EOS, tasks.FIRST_SYMBOL, tasks.FIRST_SYMBOL + 1
    target = torch.tensor([[a, b, E]] * 5)
    predicted = torch.tensor(
        [
            [a, b, E],  # exact
            [a, E, E],  # EOS before y_2: early
            [a, b, a],  # a symbol where EOS is due: does not stop
            [b, b, E],  # wrong symbol
            [b, E, a],  # wrong symbol first, then an early EOS: counted as wrong symbol
        ]
    )
    valid = torch.ones_like(target, dtype=torch.bool)
    scores = score_rows(predicted, target, valid, torch.full((5,), 2))
    assert scores["exact"].tolist() == [True, False, False, False, False]
    assert scores["early_eos"].tolist() == [False, True, False, False, False]
    assert scores["no_eos"].tolist() == [False, False, True, False, False]
    assert scores["wrong_symbol"].tolist() == [False, False, False, True, True]
    assert scores["tokens"].tolist() == [3, 2, 2, 2, 0]
    assert scores["first"].tolist() == [True, True, True, False, False]
    # the answer index of the first error
    assert scores["error_at"].tolist()[1:] == [2, 3, 1, 1]
    # rows of different lengths, left-aligned: positions past a row's n + 1 do not count
    short = score_rows(
        torch.tensor([[a, E, 0], [a, b, E]]),
        torch.tensor([[a, E, 0], [a, b, E]]),
        torch.tensor([[True, True, False], [True, True, True]]),
        torch.tensor([1, 2]),
    )
    assert short["exact"].tolist() == [True, True]


def test_the_probe_reads_the_sources_and_the_offset():
    # a head that attends exactly to each answer token's source: weight 1, and the query
    # predicting y_1 (index n + 1) attends n back on copy, 1 back on reverse
    n, t = 5, 2 * 5 + 2
    for task, offset in (("copy", n), ("reverse", 1)):
        maps = [torch.full((3, 2, t, t), 1.0 / t) for _ in range(2)]
        exact = torch.zeros(t, t)
        exact[n + 1 : 2 * n + 1, :] = 0
        j = torch.arange(1, n + 1)
        source = j if task == "copy" else n + 1 - j
        exact[n + j, source] = 1.0
        maps[1][:, 1] = exact
        weight, first_offset = _head_statistics(maps, task, n)
        assert weight.shape == first_offset.shape == (2, 2)
        assert float(weight[1, 1]) == 1.0 and float(weight.flatten()[:3].max()) < 0.1
        assert float(first_offset[1, 1]) == offset


def test_tasks_and_loss_mask():
    g = torch.Generator().manual_seed(0)
    seqs = tasks.examples("reverse", 5, 3, g)
    assert seqs.shape == (3, 13)
    assert (seqs[:, 0] == tasks.BOS).all() and (seqs[:, 6] == tasks.SEP).all()
    assert (
        torch.equal(seqs[:, 7:12], seqs[:, 1:6].flip(-1))
        and (seqs[:, 12] == tasks.EOS).all()
    )
    assert torch.equal(
        tasks.answer("sort", torch.tensor([[7, 5, 6]])), torch.tensor([[5, 6, 7]])
    )
    inputs, targets, mask, lengths = tasks.training_batch("copy", 8, 50, g)
    assert inputs.shape == targets.shape == mask.shape == (50, 18)
    assert int(mask.sum()) == int((lengths + 1).sum())  # n answer tokens + EOS per row
    assert (targets[mask] >= tasks.FIRST_SYMBOL).sum() == lengths.sum()
    padded = tasks.padded_examples("copy", torch.tensor([2, 4]), g)
    assert padded.shape == (2, 11) and (padded[0, 7:] == tasks.PAD).all()
    assert padded[0, 6] == tasks.EOS and padded[1, 10] == tasks.EOS
    with pytest.raises(ValueError, match="task must be one of"):
        tasks.answer("add", seqs)


def test_alibi_slopes_are_the_papers():
    assert alibi_slopes(4).tolist() == [2**-2, 2**-4, 2**-6, 2**-8]
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(1, 30), min_size=1, max_size=6),
    st.integers(30, 200),
    st.integers(0, 2**31 - 1),
)
def test_random_positions_are_sorted_subsets_of_the_range(lengths, random_range, seed):
    lengths_t = torch.tensor(lengths)
    positions = random_positions(
        lengths_t, 30, random_range, torch.Generator().manual_seed(seed)
    )
    assert positions.shape == (len(lengths), 30)
    assert (positions.diff(dim=1) > 0).all()
    for row, n in zip(positions, lengths):
        assert 0 <= int(row[:n].min()) and int(row[:n].max()) < random_range
        assert (row[n:] >= random_range).all()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="scheme must be one of"):
        ModelConfig(scheme="relative")
    with pytest.raises(ValueError, match="n_heads=3"):
        ModelConfig(scheme="none", d_model=64, n_heads=3)
    with pytest.raises(ValueError, match="random_range >= 30"):
        random_positions(torch.tensor([3]), 30, 20, torch.Generator())
    with pytest.raises(ValueError, match="bootstrap_interval needs counts"):
        sw.bootstrap_interval([], 10)
    with pytest.raises(ValueError, match=r"extra_seeds \[1\] repeat seeds \[1\]"):
        sw.sweep(sw.QUICK, ("copy",), ("none",), (0, 1), (1,))


def test_bootstrap_interval_is_deterministic_and_brackets_the_mean():
    counts, total = [10, 12, 30, 31, 29, 11, 30, 32, 10, 30], 32
    low, high = sw.bootstrap_interval(counts, total)
    assert (low, high) == sw.bootstrap_interval(counts, total)
    mean = sum(counts) / (len(counts) * total)
    assert min(counts) / total < low < mean < high < max(counts) / total
    assert sw.bootstrap_interval([7, 7, 7], 8) == (7 / 8, 7 / 8)
    assert sw.bootstrap_interval([5], 8) == (5 / 8, 5 / 8)
    # a bimodal set: five seeds at 0, five at 1; the mean 0.5 is no seed's value, and the
    # interval is wide
    low, high = sw.bootstrap_interval([0] * 5 + [100] * 5, 100)
    assert low <= 0.25 and high >= 0.75


def _fake_record(task: str, scheme: str, seed: int, config) -> dict:
    """A run record without training: alibi's seeds split into all right / all wrong past L."""
    lengths = list(range(1, config.eval_max_len + 1))
    m = config.eval_samples
    split = scheme == "alibi" and seed % 2 == 0
    exact = [m if n <= config.train_max_len or split else 0 for n in lengths]
    return {
        "scheme": scheme,
        "task": task,
        "seed": seed,
        "train_seconds": 0.0,
        "eval_seconds": 0.0,
        "cpu_seconds": 0.0,
        "final_loss": 0.0,
        "curve": {"steps": [config.steps], "exact": [1.0]},
        "lengths": lengths,
        "examples": m,
        "exact": exact,
        "tokens": [e * (n + 1) for e, n in zip(exact, lengths)],
        "first": exact,
        "early_eos": [m - e for e in exact],
        "no_eos": [0] * len(lengths),
        "wrong_symbol": [0] * len(lengths),
        "probe": None,
        "greedy_check": {"lengths": [], "disagreements": 0},
    }


def test_the_second_stage_adds_seeds_where_the_first_disagree(monkeypatch):
    config = sw.QUICK
    monkeypatch.setattr(
        sw, "_one", lambda job: _fake_record(job[1], job[0], job[2], job[3])
    )
    results = sw.sweep(
        config, ("copy",), ("rotary", "alibi"), (0, 1, 2), (3, 4), log=lambda _: None
    )
    seeds = {
        s: [r["seed"] for r in results["runs"] if r["scheme"] == s]
        for s in ("rotary", "alibi")
    }
    assert seeds == {"rotary": [0, 1, 2], "alibi": [0, 1, 2, 3, 4]}
    assert sw.check_schema(results) == []
    row = results["summary"]["copy"]["alibi"]
    assert row["spread"] == 1.0 and row["seeds"] == [0, 1, 2, 3, 4]
    assert row["exact_beyond"]["per_seed"] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert row["exact_beyond"]["mean"] == 0.6 and row["seeds_meeting_target"] == 5
    assert results["summary"]["copy"]["rotary"]["exact_beyond"]["ci95"] == [0.0, 0.0]
    # a file whose second stage broke the rule is caught
    broken = {**results, "runs": [r for r in results["runs"] if r["seed"] != 4]}
    assert any("missing" in p for p in sw.check_schema(broken))


def test_quick_sweep_writes_a_file_that_matches_the_schema(tmp_path):
    from experiments import run as cli

    out = tmp_path / "quick.json"
    args = (
        "--quick --steps 20 --schemes learned alibi --workers 1 --tasks copy --seeds 0"
    )
    cli.main([*args.split(), "--out", str(out)])
    results = json.loads(out.read_text())
    assert sw.check_schema(results) == []
    assert out.read_text() == sw.dumps(results)
    assert [r["scheme"] for r in results["runs"]] == ["learned", "alibi"]
    # not defined past L
    assert results["summary"]["copy"]["learned"]["exact_beyond"] is None
    assert (
        results["code"]["files"]["experiments/run.py"]
        == hashlib.sha256((ROOT / "experiments" / "run.py").read_bytes()).hexdigest()
    )
    broken = {**results, "runs": results["runs"][:1]}
    assert any("missing" in p for p in sw.check_schema(broken))


def test_the_full_sweep_refuses_uncommitted_harness_code(monkeypatch, capsys):
    from experiments import run as cli

    monkeypatch.setattr(
        sw,
        "provenance",
        lambda: {"commit": "0" * 40, "dirty": ["experiments/position/train.py"]},
    )
    monkeypatch.setattr(sw, "sweep", lambda *a, **k: pytest.fail("the sweep started"))
    with pytest.raises(SystemExit):
        cli.main(["--tasks", "copy"])
    message = capsys.readouterr().err
    assert "experiments/position/train.py" in message and "--allow-dirty" in message


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads(RESULTS.read_text())


def test_the_committed_results_file_matches_its_schema_and_its_rules(results):
    assert sw.check_schema(results) == []
    assert results["machine"]["device"] == "cpu"
    assert set(results["tasks"]) == set(sw.FULL_TASKS)
    assert set(results["schemes"]) == set(SCHEMES)
    assert tuple(results["seeds"]) == sw.FULL_SEEDS
    assert tuple(results["extra_seeds"]) == sw.EXTRA_SEEDS
    assert {k: v for k, v in results["settings"].items() if k != "evaluation"} == (
        asdict(sw.FULL)
    )
    assert results["settings"]["eval_samples"] >= 128
    # ten seeds wherever the first five disagree by more than the threshold
    for task, rows in results["summary"].items():
        for scheme, row in rows.items():
            first = sw.seed_spread(
                {**results, "runs": [r for r in results["runs"] if r["seed"] < 5]},
                task,
                scheme,
            )
            assert len(row["seeds"]) == (10 if first > sw.SPREAD else 5), (task, scheme)
    assert results["summary"] == sw.summarize(results)
    assert all(r["greedy_check"]["disagreements"] == 0 for r in results["runs"])
    assert results["cpu_seconds"] == pytest.approx(
        sum(r["cpu_seconds"] for r in results["runs"]), abs=0.1
    )
    # the processor time spread over the workers: the wall time of a quiet machine,
    # within the 45-minute budget of `make experiment` (a record, not a timing)
    assert results["machine"]["cpu_count"] == 2 and results["workers"] == 2
    assert results["cpu_seconds"] / results["workers"] <= 45 * 60
    assert len(results["load_average_during"]) == len(results["runs"])
    assert results["vocabulary"]["size"] == results["vocabulary"]["symbols"] + 4


def test_the_committed_results_record_the_commit_that_produced_them(results):
    code = results["code"]
    assert code["dirty"] == [], f"produced by uncommitted code: {code['dirty']}"
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert re.fullmatch(r"[0-9a-f]{40}", code["commit"])
    assert _git("cat-file", "-t", code["commit"]).strip() == "commit"
    for path, digest in code["files"].items():
        blob = subprocess.run(
            ["git", "show", f"{code['commit']}:{path}"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        assert hashlib.sha256(blob).hexdigest() == digest, path


def test_the_kept_weights_load(results):
    assert set(results["weights"]) == {
        "copy/sinusoidal/0",
        "copy/none/0",
        "copy/alibi/0",
    }
    for key, name in results["weights"].items():
        path = RESULTS.parent / name
        assert path.stat().st_size < 1_000_000
        task, scheme, seed = key.split("/")
        assert name == sw.weights_name(task, scheme, int(seed))
        model = TinyDecoder(sw.FULL.model_config(scheme))
        model.load_state_dict(torch.load(path, weights_only=True))  # strict


#: Numbers the chapter's markdown may state literally (outside math, code and roles), each a
#: definition, a choice of illustration or a published figure, never a result of the sweep:
#: every result is printed by a code cell that reads the results file.
LITERAL = {
    # Press et al.'s perplexities and lengths (WikiText-103), Ruoss et al.'s abstract
    *("1,024", "2,024", "16,024", "103", "19.3", "51.1", "453", "31.2", "107", "18.7"),
    *("18.1", "18.0", "12.0", "6,000", "15"),
    # the rules: the 95 % target and interval, the 0.2 spread, the resamples, chance
    *("95", "0.2", "10,000", "1/16"),
    # the maps: seed 0, layers 1 and 2, inputs of lengths 14, 18 and 30
    *("0", "1", "2", "14", "18", "30"),
}


def test_the_chapter_prose_states_no_result_by_hand():
    notebook = nbformat.read(CHAPTER, as_version=4)
    strip = [
        r"\{(cite|doc|numref|eq|ref)\}`[^`]*`",
        r"```.*?```",
        r"`[^`]*`",
        r"\$\$.*?\$\$",
        r"\$[^$]*\$",
        r"\]\([^)]*\)",
    ]
    found = set()
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        text = cell.source
        for pattern in strip:
            text = re.sub(pattern, " ", text, flags=re.S)
        found |= set(re.findall(r"(?<![\w.])\d[\d,./]*\d|(?<![\w.])\d", text))
    assert found <= LITERAL, f"numbers written by hand: {sorted(found - LITERAL)}"
