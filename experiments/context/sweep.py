"""The sweep: five base models trained at L, each evaluated zero-shot and fine-tuned under every method.

For every seed of ``SEEDS``: one base run (train at L with plain RoPE, evaluate under every method), then one
fine-tune run per method (``factor * L``, the same step budget for all). Every run executes in a worker process
whose CPU kernels are pinned to AVX2, one thread (:mod:`experiments.position.cpu`, through
:class:`experiments.position.sweep.Runner`), so that its numbers and its weights (recorded as SHA-256) are the
same on any x86 CPU with AVX2; :func:`reproduce` re-runs recorded runs and compares them bit for bit. Finished
runs go to a JSON-lines checkpoint as they finish, and a stopped sweep resumes from it (the machinery of
:mod:`experiments.position.sweep`).

:func:`summarize` reduces the runs to what the chapter prints: per (stage, method, length) the mean loss over
seeds with a Student-t 95 % interval (``experiments.position.sweep.t_interval``), the perplexity exp(mean loss)
with the interval's ends exponentiated, every seed's value, and the mean over seeds of every position bucket.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import time
from concurrent.futures import Future
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

import torch

from experiments.position.cpu import PINNED
from experiments.position.sweep import (
    LEVEL,
    Runner,
    _append,
    _resumable,
    differences,
    dumps,  # noqa: F401 (the results file's format, for __main__)
    machine,
    t_interval,
)

from . import data
from .model import METHODS, rope_parameters
from .train import RunConfig, base_run, finetune_run, settings

SCHEMA = "posenc.context-extension/1"
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
#: The harness's code (the position harness lends its pinning, runner and intervals).
CODE = ("experiments/__init__.py", "experiments/context", "experiments/position")
USED = ("posenc",)
FULL = RunConfig(base_steps=3000, finetune_steps=150, eval_windows=128)
SEEDS = tuple(range(5))
#: A smoke run for tests and CI: a smaller model at L = 16, a few steps, one seed.
QUICK = RunConfig(
    context=16,
    batch_size=16,
    base_steps=30,
    warmup=5,
    finetune_steps=8,
    finetune_warmup=2,
    eval_windows=8,
    bucket=4,
    d_model=32,
    n_heads=2,
    n_layers=1,
    d_ff=64,
)
QUICK_SEEDS = (0,)
LOG: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731


def weights_name(seed: int) -> str:
    """File name of a base model's ``state_dict``, next to the results file."""
    return f"context-extension-base-seed{seed}.pt"


def provenance() -> dict[str, Any]:
    """The commit, the files of ``CODE`` and ``USED`` that differ from it, and the SHA-256 of every
    file of ``CODE`` (the fields of :func:`experiments.position.sweep.provenance`, for this harness)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
            )
        except (OSError, subprocess.CalledProcessError):
            return None
        return done.stdout

    def changed(paths: tuple[str, ...]) -> list[str]:
        out = git("status", "--porcelain", "--untracked-files=all", "--", *paths)
        if out is None:
            return list(paths)
        return sorted(
            line[3:]
            for line in out.splitlines()
            if line.strip() and "__pycache__" not in line
        )

    files = {}
    for entry in CODE:
        path = ROOT / entry
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            files[file.relative_to(ROOT).as_posix()] = hashlib.sha256(
                file.read_bytes()
            ).hexdigest()
    commit = git("rev-parse", "HEAD")
    return {
        "commit": commit.strip() if commit else None,
        "dirty": changed(CODE),
        "used_dirty": changed(USED),
        "files": files,
    }


def _work(job: dict[str, Any]) -> dict[str, Any]:
    """One job in a pinned worker: a base run or a fine-tune run."""
    unpinned = {
        k: os.environ.get(k) for k, v in PINNED.items() if os.environ.get(k) != v
    }
    if job.get("pinned") and unpinned:
        raise RuntimeError(f"a pinned job in a worker whose environment has {unpinned}")
    torch.set_num_threads(1)
    config = RunConfig(**job["config"])
    if job["stage"] == "base":
        save = Path(job["save"]) if job["save"] else None
        return base_run(job["seed"], config, save)
    return finetune_run(
        job["seed"], job["method"], config, Path(job["base"]), job["base_sha256"]
    )


class ContextRunner(Runner):
    """:class:`experiments.position.sweep.Runner` (pinned spawned workers) running :func:`_work`."""

    def submit(self, job: dict[str, Any]) -> Future:
        if self.pool is not None:
            return self.pool.submit(_work, {**job, "pinned": True})
        future: Future = Future()
        future.set_result(_work(job))
        return future


def _key(job: dict[str, Any]) -> str:
    """What identifies a run for resuming (paths left out: the same run wherever it saves)."""
    return json.dumps(
        {k: v for k, v in job.items() if k not in ("save", "base")}, sort_keys=True
    )


def sweep(
    config: RunConfig,
    seeds: tuple[int, ...],
    weights_dir: Path,
    workers: int = 1,
    checkpoint: Path | None = None,
    log: Callable[[str], None] = LOG,
) -> dict[str, Any]:
    """Every base run of ``seeds`` and every fine-tune of each; the results-file dict.

    Args:
        config: the settings of every run.
        seeds: the base models' seeds.
        weights_dir: where the base models are saved (the fine-tunes load them).
        workers: pinned worker processes (0: this process, unpinned).
        checkpoint: JSON-lines file of finished runs to resume from and append to.
    """
    code = provenance()
    corpus = data.load()
    start, cpu_start = time.perf_counter(), time.process_time()
    stamp = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    done_before, wall_before = _resumable(checkpoint, code["commit"])
    invocation, runs, resumed, capabilities = stamp.isoformat(), [], 0, set()
    planned = len(seeds) * (1 + len(METHODS))

    def run(runner: ContextRunner, job: dict[str, Any]) -> dict[str, Any]:
        nonlocal resumed
        key = _key(job)
        if key in done_before and (
            job["stage"] != "base" or Path(job["save"]).exists()
        ):
            resumed += 1
            record = done_before[key]
        else:
            record = runner.submit(job).result()
            if checkpoint is not None:
                _append(checkpoint, {
                    "commit": code["commit"], "key": key, "invocation": invocation,
                    "elapsed": round(time.perf_counter() - start, 1), "record": record,
                })  # fmt: skip
        runs.append(record)
        capabilities.add(record["cpu_capability"])
        block = record["results"]
        at = (block["none"] if record["stage"] == "base" else block)[str(config.factor)]
        log(
            f"{len(runs):3d}/{planned} {record['stage']:8s} {record['method'] or '-':7s} "
            f"seed {record['seed']}: loss at {config.factor}L {at['loss']:.3f} "
            f"({record['cpu_seconds']:.0f} s cpu); elapsed "
            f"{(time.perf_counter() - start) / 60:.1f} min"
        )
        return record

    base_config = {f.name: getattr(config, f.name) for f in fields(config)}
    with ContextRunner(workers) as runner:
        for seed in seeds:
            save = weights_dir / weights_name(seed)
            job = {"stage": "base", "seed": seed, "method": None,
                   "config": base_config, "save": str(save)}  # fmt: skip
            base = run(runner, job)
            for method in METHODS:
                run(runner, {
                    "stage": "finetune", "seed": seed, "method": method,
                    "config": base_config, "base": str(save),
                    "base_sha256": base["weights_sha256"],
                })  # fmt: skip
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "date": stamp.date().isoformat(),
        "datetime_utc": stamp.isoformat(),
        "code": code,
        "wall_seconds": round(time.perf_counter() - start + wall_before, 1),
        "resumed_runs": resumed,
        "cpu_seconds": round(sum(r["cpu_seconds"] for r in runs), 1),
        "main_cpu_seconds": round(time.process_time() - cpu_start, 1),
        "machine": {
            **machine("cpu"),
            "cpu_capability": sorted(capabilities),
            "env": dict(PINNED) if workers > 0 else {},
        },
        "workers": workers,
        "threads_per_run": 1,
        "data": data.identity(corpus),
        "settings": settings(config),
        "methods": list(METHODS),
        "rope_parameters": {
            m: rope_parameters(m, config.context, config.factor) for m in METHODS
        },
        "seeds": list(seeds),
        "rules": {
            "level": LEVEL,
            "intervals": "mean loss over seeds: Student t; perplexity: exp of the mean "
            "loss and of the interval's ends",
            "loss": "teacher-forced next-byte cross-entropy, nats per byte, held-out files",
            "finetune": "every method the same steps, rate and bytes per step, at factor * L",
            "longrope": "not run: its per-pair factors come from a search against the "
            "model's own perplexity, with no fair counterpart at this budget",
        },
        "runs": runs,
    }
    results["summary"] = summarize(results)
    return results


def _stat(values: list[float]) -> dict[str, Any]:
    mean = sum(values) / len(values)
    low, high = t_interval(values) if len(values) > 1 else (mean, mean)
    return {
        "mean": round(mean, 6),
        "low": round(low, 6),
        "high": round(high, 6),
        "perplexity": round(math.exp(mean), 4),
        "perplexity_low": round(math.exp(low), 4),
        "perplexity_high": round(math.exp(high), 4),
        "values": values,
    }


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per stage (``zero_shot``, ``finetuned``), method and length (multiple of L): the loss over
    seeds (:func:`_stat`) and the mean over seeds of each position bucket (``buckets``)."""
    out: dict[str, Any] = {"zero_shot": {}, "finetuned": {}}
    by_seed = sorted(results["runs"], key=lambda r: (r["seed"], r["method"] or ""))
    for method in results["methods"]:
        for stage, pick in (
            ("zero_shot", lambda r: r["stage"] == "base"),
            (
                "finetuned",
                lambda r, m=method: r["stage"] == "finetune" and r["method"] == m,
            ),
        ):
            mine = [r for r in by_seed if pick(r)]
            per = {}
            for multiple in results["settings"]["eval_lengths"]:
                key = str(multiple)
                got = [
                    r["results"][method if stage == "zero_shot" else r["method"]][key]
                    if stage == "zero_shot"
                    else r["results"][key]
                    for r in mine
                ]
                columns = list(zip(*(g["buckets"] for g in got)))
                per[key] = {
                    **_stat([g["loss"] for g in got]),
                    "buckets": [round(sum(c) / len(c), 5) for c in columns],
                }
            out[stage][method] = per
    return out


def check_schema(results: dict[str, Any]) -> list[str]:
    """What is wrong with a results file (nothing: an empty list)."""
    problems = []
    if results.get("schema") != SCHEMA:
        return [f"schema: {results.get('schema')!r}, expected {SCHEMA!r}"]
    for key in ("code", "machine", "data", "settings", "runs", "summary", "wall_seconds",
                "cpu_seconds", "seeds", "methods", "rope_parameters"):  # fmt: skip
        if key not in results:
            problems.append(f"{key} missing")
    if problems:
        return problems
    config = RunConfig(**results["settings"])
    expected = sorted(
        [("base", s, "") for s in results["seeds"]]
        + [("finetune", s, m) for s in results["seeds"] for m in results["methods"]]
    )
    seen = sorted((r["stage"], r["seed"], r["method"] or "") for r in results["runs"])
    if seen != expected:
        return [f"runs: {seen}, expected {expected}"]
    lengths = [str(m) for m in config.eval_lengths]
    for r in results["runs"]:
        if r["data_sha256"] != results["data"]["sha256"]:
            problems.append(f"run {r['stage']}/{r['seed']}: data_sha256 differs")
        blocks = r["results"].values() if r["stage"] == "base" else [r["results"]]
        for block in blocks:
            if sorted(block) != sorted(lengths):
                problems.append(
                    f"run {r['stage']}/{r['seed']}: lengths {sorted(block)}"
                )
                continue
            for key in lengths:
                n = int(key) * config.context // config.bucket
                if len(block[key]["buckets"]) != n:
                    problems.append(f"run {r['stage']}/{r['seed']}: {key}L buckets")
    if summarize(results) != results["summary"]:
        problems.append("summary: not what summarize() gives for these runs")
    return problems


def reproduce(
    results: dict[str, Any],
    count: int,
    weights_dir: Path,
    seed: int = 0,
    workers: int = 1,
    log: Callable[[str], None] = lambda line: print(line, flush=True),
) -> list[tuple[str, list[str]]]:
    """Re-run ``count`` recorded runs drawn by ``random.Random(seed).sample`` and compare every
    field but the timings. A fine-tune loads its base model from ``weights_dir`` (its SHA-256
    checked); a base run saves nothing.

    Returns:
        per re-run ``(name, fields that differ)``; all empty: reproduced bit for bit.
    """
    runs = results["runs"]
    if not 1 <= count <= len(runs):
        raise ValueError(f"count must be in 1..{len(runs)}, got {count}")
    config = {k: v for k, v in results["settings"].items()}
    picked = sorted(random.Random(seed).sample(range(len(runs)), count))
    out = []
    with ContextRunner(workers) as runner:
        for i in picked:
            r = runs[i]
            name = f"{r['stage']} {r['method'] or '-'} seed {r['seed']}"
            if r["stage"] == "base":
                job = {"stage": "base", "seed": r["seed"], "method": None,
                       "config": config, "save": None}  # fmt: skip
            else:
                job = {"stage": "finetune", "seed": r["seed"], "method": r["method"],
                       "config": config, "base_sha256": r["base_weights_sha256"],
                       "base": str(weights_dir / weights_name(r["seed"]))}  # fmt: skip
            again = runner.submit(job).result()
            diff = differences(r, again)
            log(
                f"{name}: "
                + ("identical" if not diff else f"DIFFERENT in {', '.join(diff)}")
                + f" ({again['cpu_seconds']:.0f} s cpu)"
            )
            out.append((name, diff))
    return out


def table(results: dict[str, Any]) -> str:
    """The summary as text: perplexity (mean over seeds, 95 % interval) per method and length."""
    lengths = results["settings"]["eval_lengths"]
    lines = ["stage      method   " + "".join(f"{f'{m}L':>22s}" for m in lengths)]
    for stage in ("zero_shot", "finetuned"):
        for method in results["methods"]:
            cells = []
            for m in lengths:
                s = results["summary"][stage][method][str(m)]
                cells.append(
                    f"{s['perplexity']:8.3f} [{s['perplexity_low']:.3f}, "
                    f"{s['perplexity_high']:.3f}]".rjust(22)
                )
            lines.append(f"{stage:10s} {method:8s} " + "".join(cells))
    return "\n".join(lines)
