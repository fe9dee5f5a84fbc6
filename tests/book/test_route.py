"""The newcomer's route through the book, and the size of what any page shows at once, read from the notebooks.

- **The route** is the chapters a newcomer reads in order (``ROUTE``; chapter 00 ends by naming them). On it a
  visible code cell (one whose source is not behind a "Show code cell source" or "Show code cell content" button)
  holds at most ``ROUTE_CELL`` = 20 lines, up to the chapter's *Going further* part (the second reading, off the
  route). The cells still over it are counted per chapter in ``ROUTE_OVER``: the count may only go down (issue 33
  asks for none), so a new long cell on the route fails here.
- **Anywhere in the book** a visible code cell holds at most ``ANY_CELL`` = 40 lines.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.book.browser_helpers import ROOT

ROUTE = (
    "00_first_read",
    "01_derivation",
    "02_module",
    "06_rotary",
    "07_timesteps_and_grids",
    "08_position_matters",
    "09_context_extension",
)
ROUTE_CELL = 20
ANY_CELL = 40
#: Visible cells over ROUTE_CELL lines that each route chapter still has (the target is 0 everywhere).
ROUTE_OVER = {
    "00_first_read": 0,
    "01_derivation": 0,
    "02_module": 0,
    "06_rotary": 0,
    "07_timesteps_and_grids": 0,
    "08_position_matters": 0,
    "09_context_extension": 0,
}
HIDDEN = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
CHAPTERS = sorted(p.stem for p in (ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


def visible_cells(chapter: str, route: bool = False) -> list[tuple[int, int, str]]:
    """``(index, lines, first line)`` of each code cell whose source the page shows (``route``: up to the
    chapter's *Going further* part, what the route reads)."""
    nb = json.loads((ROOT / "book" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
    out = []
    for index, cell in enumerate(nb["cells"]):
        if route and _going_further(cell):
            break
        if cell["cell_type"] != "code":
            continue
        if HIDDEN & set(cell["metadata"].get("tags", [])):
            continue
        lines = "".join(cell["source"]).rstrip("\n").split("\n")
        out.append((index, len(lines), lines[0]))
    return out


def test_the_route_is_chapters_of_the_book() -> None:
    assert set(ROUTE) <= set(CHAPTERS)
    assert set(ROUTE_OVER) == set(ROUTE)


@pytest.mark.parametrize("chapter", ROUTE)
def test_route_cells_are_short(chapter: str) -> None:
    long = [c for c in visible_cells(chapter, route=True) if c[1] > ROUTE_CELL]
    assert len(long) <= ROUTE_OVER[chapter], (
        f"book/{chapter}.ipynb shows {len(long)} code cells over {ROUTE_CELL} lines on the newcomer route "
        f"(at most {ROUTE_OVER[chapter]}): {long}; split the cell, or hide plumbing with a hide-input tag"
    )


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_visible_cell_is_over_40_lines(chapter: str) -> None:
    long = [c for c in visible_cells(chapter) if c[1] > ANY_CELL]
    assert not long, (
        f"book/{chapter}.ipynb shows code cells over {ANY_CELL} lines: {long}"
    )


#: Reading speed behind the time the introduction gives for the route, in words of prose a minute.
WORDS_PER_MINUTE = 200


#: The most words of prose each route chapter may hold up to its *Going further* part: the route, chapter 00
#: included, is at most ROUTE_WORDS (issue 33: 45 minutes at 200 words a minute).
CHAPTER_WORDS = {
    "00_first_read": 2550,
    "01_derivation": 1400,
    "02_module": 900,
    "06_rotary": 1400,
    "07_timesteps_and_grids": 800,
    "08_position_matters": 1300,
    "09_context_extension": 600,
}
ROUTE_WORDS = 9000


def chapter_words(chapter: str) -> int:
    """Words of prose in ``chapter`` up to its *Going further* part (markdown cells; code and outputs apart)."""
    nb = json.loads((ROOT / "book" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
    words = 0
    for cell in nb["cells"]:
        if _going_further(cell):
            break
        if cell["cell_type"] == "markdown":
            words += len("".join(cell["source"]).split())
    return words


def route_words(chapters: tuple[str, ...] = ROUTE[1:]) -> int:
    """Words of prose a newcomer reads on ``chapters`` (default: the route after chapter 00)."""
    return sum(chapter_words(chapter) for chapter in chapters)


def test_the_route_is_at_most_45_minutes() -> None:
    assert sum(CHAPTER_WORDS.values()) <= ROUTE_WORDS
    assert route_words(ROUTE) <= ROUTE_WORDS, route_words(ROUTE)


@pytest.mark.parametrize("chapter", ROUTE)
def test_route_chapter_words(chapter: str) -> None:
    words = chapter_words(chapter)
    assert words <= CHAPTER_WORDS[chapter], (
        f"book/{chapter}.ipynb holds {words} words of prose before its Going further part (at most "
        f"{CHAPTER_WORDS[chapter]}): move derivations, precision and library material past the heading"
    )


def _going_further(cell: dict) -> bool:
    """Whether a cell opens the chapter's *Going further* part (a second reading, off the route)."""
    text = "".join(cell["source"])
    return cell["cell_type"] == "markdown" and bool(
        re.search(r"^## Going further", text, re.M)
    )


def test_the_introduction_names_the_route_and_its_length() -> None:
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    route = intro[intro.index("**The newcomer route**") :].split("\n- ")[0]
    named = re.findall(r"\{doc\}`(\d\d_\w+)`", route)
    assert tuple(named) == ROUTE[1:], named
    minutes = int(re.search(r"about (\d+) minutes", route).group(1))
    measured = route_words() / WORDS_PER_MINUTE
    assert abs(minutes - measured) <= 0.1 * measured, (
        f"book/intro.md says the route takes about {minutes} minutes; its {route_words()} words read in "
        f"{measured:.0f} at {WORDS_PER_MINUTE} words a minute: change the number"
    )
