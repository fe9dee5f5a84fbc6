"""The notebooks are the source and the expectations: clean metadata, executed in order, in the table of contents,
each opening with its claim and closing with a summary. The build configuration keeps the book offline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
IDS = [p.name for p in NOTEBOOKS]


def _toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [chapter["file"] for chapter in part.get("chapters", [])]
    files += [chapter["file"] for chapter in toc.get("chapters", [])]
    return files


def test_notebooks_exist() -> None:
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_metadata_is_clean_and_cells_ran_in_order(path: Path) -> None:
    nb = json.loads(path.read_text())
    assert set(nb["metadata"]) <= {"kernelspec", "language_info"}, (
        f"{path.name}: run `make notebooks` to clean"
    )
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    counts = []
    for cell in nb["cells"]:
        assert set(cell.get("metadata", {})) <= {"tags", "mystnb", "posenc"}, (
            f"{path.name}: unexpected cell metadata {cell['metadata']}"
        )
        if cell["cell_type"] == "code":
            counts.append(cell["execution_count"])
            for output in cell["outputs"]:
                assert not (
                    output["output_type"] == "stream"
                    and output["name"] == "stderr"
                    and "Warning" in "".join(output["text"])
                ), f"{path.name}: a warning in the stored output; fix its cause"
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: not executed top to bottom; run `make notebooks`"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_ignored_outputs_say_why(path: Path) -> None:
    for cell in json.loads(path.read_text())["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if "nbval-ignore-output" in tags:
            assert "#" in "".join(cell["source"]), (
                f"{path.name}: a cell whose output is ignored must say why in a comment"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_each_chapter_opens_with_its_claim_and_ends_with_a_summary(path: Path) -> None:
    markdown = [
        ("".join(c["source"]))
        for c in json.loads(path.read_text())["cells"]
        if c["cell_type"] == "markdown"
    ]
    assert markdown and markdown[0].startswith("# ") and "**Claim.**" in markdown[0], (
        path.name
    )
    assert "## Summary" in markdown[-1] and "tests/" in markdown[-1], path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_notebook_is_in_the_table_of_contents(path: Path) -> None:
    assert f"book/{path.stem}" in _toc_files()


def test_every_toc_entry_exists() -> None:
    for entry in _toc_files():
        assert any(
            (ROOT / f"{entry}{suffix}").exists() for suffix in (".md", ".ipynb")
        ), entry


def test_notebook_names_are_numbered_in_reading_order() -> None:
    chapters = [f for f in _toc_files() if re.match(r"book/\d\d_", f)]
    assert chapters == sorted(chapters)


def test_book_configuration_is_offline_and_strict() -> None:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["only_build_toc_files"] is True
    assert {".venv*", "_build"} <= set(config["exclude_patterns"])
    assert config["execute"]["execute_notebooks"] == "off"
    sphinx = config["sphinx"]
    extensions = sphinx.get("extra_extensions", []) + sphinx.get("config", {}).get(
        "extensions", []
    )
    assert "sphinx-mathjax-offline" in extensions, "MathJax must be served locally"
    assert "-W --keep-going" in (ROOT / "Makefile").read_text()


def test_requirements_pin_every_package_exactly() -> None:
    lines = [
        line.strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert "-e ." in lines
    unpinned = [line for line in lines if line != "-e ." and "==" not in line]
    assert not unpinned, unpinned
    assert "torch==2.13.0" in lines
