"""DistributedDataParallel with posenc: 2 CPU processes (gloo on 127.0.0.1) train a small model with a different
sequence length on each rank. No error or hang, identical parameters afterwards, and zero bytes of positional
table broadcast by DDP per step (the classic modules are measured the same way, as a control).

The workers are started and always cleaned up by ``tests.references.ddp_worker.launch`` (bounded by a timeout);
the book's chapter ``book/13_reliability.ipynb`` prints the same measurements.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.references import ddp_worker
from tests.references.ddp_worker import MODELS, SEQ_LENS, STEPS, launch

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(),
    reason="this torch build has no torch.distributed",
)

#: bytes of the constant table the classic modules register as a buffer: max_len * d_model * 4 (float32)
CLASSIC_TABLE_BYTES = {"labml": 5000 * 512 * 4, "spotpython": 12552 * 512 * 4}


@pytest.fixture(scope="module")
def report() -> dict:
    # The timeout only guards against a hang (workers are killed past it); no time is asserted. Under a
    # parallel `make test` on 2 busy cores, two ranks importing torch have taken over 45 s.
    start = time.perf_counter()
    result = launch(world_size=2, timeout=180.0)
    print(
        f"DDP workers finished in {time.perf_counter() - start:.1f} s", file=sys.stderr
    )
    return result


def test_one_measurement_serves_the_whole_run(
    report: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tests.references.ddp_worker.launch stores the report in the run's directory
    # (tests/plugin.py): chapter 13, in a notebook kernel of this run, reads it instead
    # of starting two more processes
    assert Path(os.environ["POSENC_RUN_DIR"], "ddp-report-2.json").is_file()

    def measure_again(*args: object) -> None:
        raise AssertionError(
            "launch started the workers again instead of reading the run's report"
        )

    monkeypatch.setattr(ddp_worker, "_launch", measure_again)
    assert launch(world_size=2, timeout=180.0) == report


def test_every_rank_reports_every_model(report: dict) -> None:
    assert sorted(report) == [0, 1]
    for rank in report:
        assert list(report[rank]) == list(MODELS)
        for name in MODELS:
            assert report[rank][name]["seq_lens"] == SEQ_LENS[rank]
    assert SEQ_LENS[0] != SEQ_LENS[1]  # different sequence lengths on the two ranks


@pytest.mark.parametrize("name", MODELS)
def test_parameters_identical_across_ranks_after_training(
    report: dict, name: str
) -> None:
    for rank in report:
        assert report[rank][name]["params_identical"]
        assert report[rank][name]["params_changed"]  # training happened


@pytest.mark.parametrize("name", [m for m in MODELS if m.startswith("posenc")])
def test_posenc_broadcasts_zero_positional_bytes(report: dict, name: str) -> None:
    for rank in report:
        measured = report[rank][name]
        assert measured["buffer_bytes"] == 0 and measured["held_by_ddp"] == 0
        assert measured["checkpoint_keys"] == []
        assert measured["construction"]["positional"] == 0
        assert len(measured["steps"]) == STEPS
        for step in measured["steps"]:
            # the meter fired (DDP broadcast the BatchNorm buffers, and only those) and sent no positional table
            assert step["calls"] == 1
            assert step["positional"] == 0
            assert step["other"] == measured["other_buffer_bytes"]


@pytest.mark.parametrize("name", sorted(CLASSIC_TABLE_BYTES))
def test_classic_modules_broadcast_their_table_every_step(
    report: dict, name: str
) -> None:
    # the control: the same meter sees the classic tables (10.24 MB for labml, 25.7 MB for spotpython) every step
    for rank in report:
        measured = report[rank][name]
        assert (
            measured["buffer_bytes"]
            == measured["held_by_ddp"]
            == CLASSIC_TABLE_BYTES[name]
        )
        assert measured["construction"]["positional"] == CLASSIC_TABLE_BYTES[name]
        for step in measured["steps"]:
            assert step["positional"] == CLASSIC_TABLE_BYTES[name]
            assert step["other"] == measured["other_buffer_bytes"]
