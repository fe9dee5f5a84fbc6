"""Re-execute notebooks in place and store clean outputs: the expectations nbval compares.

    python tools/nbrun.py book/01_derivation.ipynb ...   (default: every notebook in book/)
    python tools/nbrun.py --refresh-ignored ...           (also store new outputs of nbval-ignore-output cells)

Each notebook runs top to bottom in a fresh kernel with the working directory ``book/``; execution counts are
renumbered from 1 and metadata is reduced to the kernelspec and language name, so diffs show only real changes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.notebooks.plugin import drop_torch_notices  # noqa: E402

KEEP_CELL_METADATA = {"tags", "mystnb", "posenc"}


def clean(nb: nbformat.NotebookNode) -> None:
    """Reduce metadata to what is needed and renumber executions (in place)."""
    nb.metadata = nbformat.from_dict(
        {
            "kernelspec": {
                "display_name": "Python 3",
                "language": "python",
                "name": "python3",
            },
            "language_info": {"name": "python"},
        }
    )
    nb.nbformat, nb.nbformat_minor = 4, 5
    count = 0
    for index, cell in enumerate(nb.cells):
        cell.metadata = nbformat.from_dict(
            {k: v for k, v in cell.metadata.items() if k in KEEP_CELL_METADATA}
        )
        cell.id = f"cell-{index:03d}"
        if cell.cell_type == "code":
            count += 1
            cell.execution_count = count
            cell.outputs = _coalesce_streams(
                [nbformat.from_dict(o) for o in drop_torch_notices(cell.outputs)]
            )
            for output in cell.outputs:
                if "execution_count" in output:
                    output.execution_count = count
                if "metadata" in output:
                    output.metadata = nbformat.from_dict({})


def _coalesce_streams(outputs: list) -> list:
    """Merge consecutive stdout (or stderr) chunks: how the kernel splits a stream depends on timing."""
    merged: list = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (
            output.get("output_type") == "stream"
            and previous is not None
            and previous.get("output_type") == "stream"
            and previous.get("name") == output.get("name")
        ):
            previous["text"] = "".join(previous["text"]) + "".join(output["text"])
        else:
            merged.append(output)
    return merged


def _source_hash(cell: nbformat.NotebookNode) -> str:
    return hashlib.sha256("".join(cell.source).encode()).hexdigest()[:16]


def _ignored_outputs(nb: nbformat.NotebookNode) -> dict[str, list]:
    """Stored outputs of the cells whose output nbval ignores (live timings, the machine's name), keyed by the
    hash of the source that produced them (recorded in the cell's ``posenc.source`` metadata)."""
    kept = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or "nbval-ignore-output" not in cell.metadata.get(
            "tags", []
        ):
            continue
        produced_by = cell.metadata.get("posenc", {}).get("source")
        if produced_by == _source_hash(cell) and cell.get("outputs"):
            kept[produced_by] = cell.outputs
    return kept


def run(path: Path, *, refresh_ignored: bool = False) -> None:
    """Execute ``path`` in place. A cell whose output nbval ignores keeps its stored output when its source is
    the one that produced it (unless ``refresh_ignored``): its output varies from run to run by nature, and
    re-running the notebooks must leave an unchanged repository unchanged."""
    nb = nbformat.read(path, as_version=4)
    kept = {} if refresh_ignored else _ignored_outputs(nb)
    start = time.perf_counter()
    env_cwd = str(path.parent)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": env_cwd}},
    ).execute()
    for cell in nb.cells:
        if cell.cell_type == "code" and "nbval-ignore-output" in cell.metadata.get(
            "tags", []
        ):
            digest = _source_hash(cell)
            if digest in kept:
                cell.outputs = kept[digest]
            cell.metadata["posenc"] = {"source": digest}
    clean(nb)
    nbformat.write(nb, path)
    print(
        f"executed {path.relative_to(ROOT).as_posix()} in {time.perf_counter() - start:.1f} s"
    )


def main(argv: list[str]) -> int:
    refresh = "--refresh-ignored" in argv
    argv = [a for a in argv if a != "--refresh-ignored"]
    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "book").glob("*.ipynb"))
    # A private torch.compile cache for this run (see tests/plugin.py): a shared one, reused after torch's
    # CPU kernel family changed, has produced silently wrong compiled code.
    cache = tempfile.mkdtemp(prefix="posenc-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    try:
        for path in paths:
            run(path, refresh_ignored=refresh)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
