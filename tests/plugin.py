"""The run-wide pytest plugin (``-p tests.plugin`` in pyproject.toml): what every run of the suite needs, with or
without notebooks. The notebook-run plumbing (kernels, start-up file, stream filters) is in tests/notebooks/ and is
loaded only where notebooks run (book/conftest.py).

1. **A private torch.compile cache per run.** ``torch.compile`` keeps compiled kernels in an on-disk cache shared
   by every checkout and every run (``/tmp/torchinductor_<user>``). Reused after torch's CPU kernel family
   changed (``ATEN_CPU_CAPABILITY=avx2`` after an AVX-512 run), it has returned *silently wrong* compiled
   results here. Each pytest run therefore gets a fresh ``TORCHINDUCTOR_CACHE_DIR``, set before any test
   imports inductor and inherited by its pytest-xdist workers and the notebook kernels nbval starts (one
   run, one machine, one kernel family: a graph compiled by a test and again by a chapter is compiled once);
   it lives in the run's own directory (``POSENC_RUN_DIR``), which is removed at the end. Kernels are compiled
   in the compiling process (``TORCHINDUCTOR_COMPILE_THREADS=1`` unless set): inductor's default on this
   2-core machine, a pool of compile subprocesses started in each compiling process, costs more than it saves
   (the same generated code; one `make test` each: 218.8 s compiling in process, 223.1 s and 223.8 s with the
   pool).
2. **No grammar built at start-up.** nbval reads notebooks with nbformat, which imports jsonschema, which imports
   ``rfc3987_syntax`` when it is installed (jupyter-events needs it) to check the ``"iri"`` string format; that
   import builds a parser grammar, 2.3 s in every pytest process (the xdist controller and each worker). No
   schema read here uses that format (nbformat's have no ``format`` keyword), so the import is refused in the
   test processes: this plugin is loaded (``-p`` in pyproject.toml) before pytest loads nbval.
3. **Notebooks stay whole under pytest-xdist.** ``--dist loadgroup`` is scheduled by :class:`GroupedScheduling`:
   a notebook's cells are one unit (one worker, one kernel, in order), the browser tests another, the tests that
   import the installed peers a third (one worker imports them), the tests that compile a fourth. It lives here,
   not in tests/conftest.py, because ``pytest book`` (``make test-portable``) never reads that conftest: there,
   xdist's own loadgroup (which pytest 9 makes ignore its groups) spread the cells of one notebook over both
   workers, and every cell after the first ran in a kernel that had not run the imports.
4. **A closing summary of what was skipped**, grouped by reason, so that a run without a built book (the browser
   tests) or without CUDA (the GPU tests) says so in one place.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any

import pytest

# see 2. above: jsonschema then skips the "iri" format
if "rfc3987_syntax" not in sys.modules:
    sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]

_run_dir: str | None = None
#: A directory for this whole run, set by the process that created it: pytest-xdist workers (and the notebook
#: kernels and subprocesses they start) inherit it and share what it holds (the torch.compile cache in
#: ``inductor/``; ``tests.references.ddp_worker.launch``'s one DDP measurement per run);
#: only its creator removes it.
RUN_DIR_VARIABLE = "POSENC_RUN_DIR"


def run_dir() -> str | None:
    """This pytest run's shared directory, or None outside a run (a notebook opened by hand)."""
    found = os.environ.get(RUN_DIR_VARIABLE)
    return found if found and os.path.isdir(found) else None


#: Test files that drive the browser: one group, one Chromium.
BROWSER_FILES = ("test_browser.py", "test_layout.py")
#: Test files whose module-scoped fixture is expensive (a DDP launch): each such file is one
#: unit, so that the fixture runs once per run rather than once per worker.
FILE_UNITS = ("test_ddp.py",)
#: Tests that import the installed peers (transformers, diffusers, rotary-embedding-torch; imported at first use,
#: tests/references/peers.py): one unit, so that one worker pays for their imports (about 6.5 s on this machine),
#: not each. The files that import a peer at their top level or run a benchmark against one, and the tests marked
#: ``peers`` elsewhere (tests/notebooks/test_plugins.py checks that the two lists hold every such file and test).
PEER_FILES = (
    "test_rotation_peers.py",
    "test_embeddings_peers.py",
    "test_bench_sincos.py",
    "test_bench_rotary.py",
)
PEER_TESTS = (
    "tests/sinusoidal/test_encoding_conventions.py"
    "::test_the_installed_hugging_face_tables",
)
#: Tests that compile or export with torch (test_compile.py, and elsewhere tests whose names say so: "compile",
#: "inductor", "export"): one unit, so that one worker imports torch's compiler stack (about 4 s) and starts
#: inductor once, and later graphs reuse what earlier ones built in the same process (tests/notebooks/test_plugins.py
#: checks that every test calling torch.compile, torch.export or torch._dynamo has such a name).
COMPILE_WORDS = ("compile", "inductor", "export")
COMPILE_FILES = ("test_compile.py",)  # all of it
#: Tests that take many seconds each; started early, like the groups (seconds measured on 2 cores, serial run).
SLOW_FILES = ("test_ddp.py", "test_package.py", "test_compile.py", "test_nbexport.py")


def scope_of(nodeid: str) -> str:
    """The scheduling unit of a test id under ``make test``: its notebook (all of a notebook's cells run in one
    worker, in order), ``browser`` for the browser tests, ``peers`` for those that import the installed peers,
    ``compile`` for those that compile or export with torch, or the test itself."""
    head = nodeid.split("::", 1)[0]
    if (
        head.endswith(".ipynb") or "::ipynb::" in nodeid
    ):  # pytest 9 may render "nb::ipynb::Cell 3"
        return f"notebook {head.removesuffix('.ipynb')}"
    name = head.rsplit("/", 1)[-1]
    if name in BROWSER_FILES:
        return "browser"
    if name in FILE_UNITS:
        return head
    function = nodeid.partition("::")[2].split("[", 1)[
        0
    ]  # the test's name, without parameters
    if name in PEER_FILES or f"{head}::{function}" in PEER_TESTS:
        return "peers"
    if name in COMPILE_FILES or any(word in function for word in COMPILE_WORDS):
        return "compile"
    return nodeid


class GroupedScheduling:
    """With ``--dist loadgroup``, schedule by :func:`scope_of`. (xdist's own loadgroup writes the group into
    ``item._nodeid``, which pytest 9 no longer reads, so its groups are silently ignored; this scheduler keys on
    the test ids themselves.) Registered only where pytest-xdist is installed."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "loadgroup":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class Scheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return scope_of(nodeid)

        return Scheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    global _run_dir
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(GroupedScheduling(), "posenc-grouped-scheduling")
    if run_dir() is None:  # not a worker of a run that made one: this process makes it
        _run_dir = tempfile.mkdtemp(prefix="posenc-run-")
        os.environ[RUN_DIR_VARIABLE] = _run_dir
    cache = os.path.join(os.environ[RUN_DIR_VARIABLE], "inductor")
    os.makedirs(cache, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say plainly what a run skipped as a whole (the browser tests without a built book, the GPU tests)."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
            reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("what was skipped, and why")
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{count:5d} skipped: {reason}")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _run_dir is not None:
        shutil.rmtree(_run_dir, ignore_errors=True)
        if os.environ.get(RUN_DIR_VARIABLE) == _run_dir:
            del os.environ[RUN_DIR_VARIABLE]
