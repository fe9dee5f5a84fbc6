"""The census (tests/census): posenc's rotary swap over every family of the installed transformers that defines
a rotary class, each built tiny offline, with the two controls (a doubled rope base is caught; transformers' own
module swapped in by the harness passes).

It takes about a minute on 2 cores (two processes), beyond what ``make test`` can add within its budget: it runs
when ``POSENC_CENSUS=1`` (its own make target), and is skipped otherwise.
"""

from __future__ import annotations

import os

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("POSENC_CENSUS") != "1",
        reason="the census runs on its own "
        "(POSENC_CENSUS=1 pytest tests/conventions/test_hf_census.py)",
    ),
]


@pytest.fixture(scope="module")
def census():
    pytest.importorskip("transformers")
    from tests.census.runner import run

    return run()


def test_the_census_finds_the_rotary_families(census):
    assert census["families"] >= 193


def test_no_family_goes_wrong(census):
    wrong = {
        e["family"]: e["message"] for e in census["results"] if e["status"] == "wrong"
    }
    assert not wrong


def test_every_family_is_ok_or_refused_or_not_built_with_a_reason(census):
    unexplained = {
        e["family"]: (e["status"], e.get("message"))
        for e in census["results"]
        if e["status"] not in ("ok", "refused", "not_built")
        or (e["status"] != "ok" and not e.get("message"))
    }
    assert not unexplained


def test_the_controls_hold_for_every_ok_family(census):
    from tests.census.compare import CAUGHT

    for e in census["results"]:
        if e["status"] == "ok":
            assert e["own_error_over_bound"] <= 1, e["family"]
            assert (
                e["doubled_base_over_bound"] is None
                or e["doubled_base_over_bound"] >= CAUGHT
            )


def test_posenc_reads_which_layers_rotate_for_every_ok_family(census):
    """posenc.conventions.rotated_layers (the condition around the rotation in the family's attention code) names,
    among the layers that hold the family's attention, those that a spy on the rotation function sees rotating, or
    says why it cannot (a condition on more than the module's attributes)."""
    for e in census["results"]:
        if e["status"] != "ok":
            continue
        read, seen = e["rotated_layers"], e["layers_seen_rotating"]
        if isinstance(read, str) and read.startswith("refused: "):
            continue  # posenc says why it cannot tell (and from_hf_config warns so)
        assert isinstance(seen, list), (e["family"], seen)
        assert [i for i in read if i in e["attention_layers"]] == seen, (
            e["family"],
            read,
            seen,
            e["attention_layers"],
        )
