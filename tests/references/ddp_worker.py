"""Train a small language model under ``DistributedDataParallel`` in CPU processes (gloo) and measure what DDP
broadcasts, for posenc's ``PositionalEncoding`` and the two classic modules.

Used by ``tests/deployment/test_ddp.py`` and ``book/13_reliability.ipynb``:

    from tests.references.ddp_worker import launch
    report = launch()            # starts 2 worker processes, waits (bounded), always cleans them up

The worker side runs as ``python -m tests.references.ddp_worker RANK WORLD_SIZE PORT OUT_DIR``.

**How the bytes are measured.** DDP hands every tensor it broadcasts to one function,
``torch.distributed._broadcast_coalesced(process_group, tensors, bucket_size, src)``: once at construction
(parameters and buffers, from rank 0) and, with ``broadcast_buffers=True`` (the default), at the start of every
forward (all of ``module.named_buffers()``, persistent or not). The worker wraps that function and records, for
each call, the bytes of the tensors that share storage with the positional module's buffers ("positional") and
of all the others ("other"). The model also holds a ``BatchNorm1d`` so that DDP has a buffer to broadcast in every
configuration; the wrapper is therefore seen to fire for posenc too, and the positional part is measured, not
assumed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

try:
    import fcntl  # the lock that shares one measurement per run (POSIX)
except ImportError:  # Windows: every call measures
    fcntl = None  # type: ignore[assignment]

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
D_MODEL = 512
VOCAB = 32
BATCH = 2
STEPS = 3
#: sequence lengths per rank and step: different on each rank; rank 1 goes past posenc's small cache (max_len=16)
SEQ_LENS = {0: [7, 9, 11], 1: [12, 20, 5]}


def make_positional(name: str) -> nn.Module:
    """The positional module under test, by name, with the defaults of its library (d_model = 512)."""
    from posenc import PositionalEncoding
    from tests.references.classic import (
        LabmlPositionalEncoding,
        SpotpythonPositionalEncoding,
    )

    if name == "posenc":
        return PositionalEncoding(D_MODEL, 0.1)  # max_len 5000, as labml's default
    if name == "posenc float64, max_len=16":
        return PositionalEncoding(
            D_MODEL, 0.1, max_len=16
        )  # the model is cast to float64 below
    if name == "labml":
        return LabmlPositionalEncoding(
            D_MODEL, 0.1
        )  # non-persistent buffer, max_len 5000
    if name == "spotpython":
        return SpotpythonPositionalEncoding(
            D_MODEL, 0.1
        )  # persistent buffer, max_len 12552
    raise ValueError(f"unknown positional module {name!r}")


MODELS = ("posenc", "posenc float64, max_len=16", "labml", "spotpython")


class TinyLM(nn.Module):
    """Embedding -> positional encoding -> BatchNorm over tokens -> linear head. tokens: ``[seq_len, batch]``."""

    def __init__(self, positional: nn.Module) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.positional = positional
        self.norm = nn.BatchNorm1d(
            D_MODEL
        )  # a buffer DDP must broadcast every step, whatever the encoding
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.positional(
            self.embed(tokens) * math.sqrt(D_MODEL)
        )  # [seq_len, batch, d_model]
        h = self.norm(h.flatten(0, 1)).view_as(h)
        return self.head(h)  # [seq_len, batch, vocab]


class BroadcastMeter:
    """Wraps ``torch.distributed._broadcast_coalesced`` and sorts the bytes DDP sends into positional / other."""

    def __init__(self) -> None:
        self.positional_storages: set[int] = set()
        self.calls: list[dict[str, int]] = []
        self._original = None

    def __enter__(self) -> BroadcastMeter:
        import torch.distributed as dist

        self._original = dist._broadcast_coalesced

        def counting(process_group, tensors, buffer_size, src):
            call = {"positional": 0, "other": 0}
            for t in tensors:
                part = (
                    "positional"
                    if t.untyped_storage().data_ptr() in self.positional_storages
                    else "other"
                )
                call[part] += t.numel() * t.element_size()
            self.calls.append(call)
            return self._original(process_group, tensors, buffer_size, src)

        dist._broadcast_coalesced = counting
        return self

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist

        dist._broadcast_coalesced = self._original

    def take(self) -> dict[str, int]:
        """Bytes recorded since the last ``take`` (summed over calls), and reset."""
        total = {"positional": 0, "other": 0, "calls": len(self.calls)}
        for call in self.calls:
            total["positional"] += call["positional"]
            total["other"] += call["other"]
        self.calls.clear()
        return total


def train(name: str, rank: int, world_size: int) -> dict[str, object]:
    """Build, wrap in DDP, train STEPS steps with this rank's sequence lengths; return what was measured."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(
        0
    )  # same initial weights on both ranks (DDP would broadcast rank 0's anyway)
    model = TinyLM(make_positional(name))
    if "float64" in name:
        model = (
            model.double()
        )  # a dtype cast: posenc's cache follows x's dtype, nothing to convert
    with BroadcastMeter() as meter:
        meter.positional_storages = {
            b.untyped_storage().data_ptr() for b in model.positional.buffers()
        }
        ddp = DistributedDataParallel(
            model
        )  # CPU, gloo; broadcast_buffers=True is the default
        construction = meter.take()
        initial = torch.cat(
            [p.detach().flatten().double() for p in model.parameters()]
        ).clone()
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(
            100 + rank
        )  # different data on each rank
        steps = []
        for seq_len in SEQ_LENS[rank]:
            tokens = torch.randint(VOCAB, (seq_len + 1, BATCH), generator=generator)
            logits = ddp(tokens[:-1])
            loss = nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), tokens[1:].flatten()
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps.append(meter.take())
    final = torch.cat([p.detach().flatten().double() for p in model.parameters()])
    gathered = [torch.empty_like(final) for _ in range(world_size)]
    dist.all_gather(gathered, final)
    return {
        "construction": construction,
        "steps": steps,
        "seq_lens": SEQ_LENS[rank],
        "params_identical": all(torch.equal(g, gathered[0]) for g in gathered),
        "params_changed": not torch.equal(final, initial),
        "buffer_bytes": sum(
            b.numel() * b.element_size() for b in model.positional.buffers()
        ),
        # a second view of the same fact: the positional bytes among the buffers DDP holds for its per-step sync
        "held_by_ddp": sum(
            b.numel() * b.element_size()
            for b in ddp.modules_buffers
            if b.untyped_storage().data_ptr() in meter.positional_storages
        ),
        "other_buffer_bytes": sum(
            b.numel() * b.element_size() for b in model.norm.buffers()
        ),
        "checkpoint_keys": sorted(
            k for k in model.state_dict() if k.startswith("positional.")
        ),
    }


def worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore(
        "127.0.0.1", port, world_size, is_master=False, timeout=timedelta(seconds=30)
    )
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=30),
    )
    try:
        report = {name: train(name, rank, world_size) for name in MODELS}
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))


def launch(
    world_size: int = 2, timeout: float = 45.0
) -> dict[int, dict[str, dict[str, object]]]:
    """Run the workers once per test run; return ``{rank: {model name: measurements}}``.

    Inside a pytest run (``POSENC_RUN_DIR``, tests/plugin.py), tests/deployment/test_ddp.py and chapter 13 share
    one measurement: the first caller runs the workers and stores their report in the run's directory, under a
    lock; a later caller (another xdist worker, a notebook kernel) reads it. Outside a run, every call measures.
    """
    run_dir = os.environ.get("POSENC_RUN_DIR")
    if not run_dir or not os.path.isdir(run_dir) or fcntl is None:
        return _launch(world_size, timeout)
    stored = Path(run_dir, f"ddp-report-{world_size}.json")
    with open(stored.with_suffix(".lock"), "w") as lock:
        # a second caller waits here for the first one's report
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stored.exists():
            report = _launch(world_size, timeout)
            stored.write_text(json.dumps([report[rank] for rank in range(world_size)]))
        return dict(enumerate(json.loads(stored.read_text())))


def _launch(world_size: int, timeout: float) -> dict[int, dict[str, dict[str, object]]]:
    """Run the workers; return ``{rank: {model name: measurements}}``.

    The rendezvous store is created here on a free port chosen by the OS (port 0: no race for a port); the
    workers are killed if they have not finished within ``timeout`` seconds, and in every case before returning.

    Raises:
        RuntimeError: a worker failed or timed out; the message holds its stderr.
    """
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1",
        0,
        None,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=30),
    )
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on the loopback interface
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as out_dir:
        logs = [Path(out_dir, f"rank{rank}.log") for rank in range(world_size)]
        try:
            for rank in range(world_size):
                command = [
                    sys.executable,
                    "-m",
                    "tests.references.ddp_worker",
                    str(rank),
                    str(world_size),
                    str(store.port),
                    out_dir,
                ]
                with open(logs[rank], "w") as log:
                    procs.append(
                        subprocess.Popen(
                            command,
                            cwd=ROOT,
                            env=env,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                        )
                    )
            deadline = time.monotonic() + timeout
            # wait for all; stop at once if one fails (its peer would otherwise block in a collective)
            while any(proc.poll() is None for proc in procs) and not any(
                proc.poll() for proc in procs
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"DDP workers did not finish within {timeout} s:\n{_tails(logs)}"
                    )
                time.sleep(0.05)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        codes = [proc.returncode for proc in procs]
        if any(code != 0 for code in codes):
            raise RuntimeError(
                f"DDP workers failed with exit codes {codes}:\n{_tails(logs)}"
            )
        return {
            rank: json.loads(Path(out_dir, f"rank{rank}.json").read_text())
            for rank in range(world_size)
        }


def _tails(logs: list[Path]) -> str:
    return "\n".join(
        f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs if log.exists()
    )


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
