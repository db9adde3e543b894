"""Every notebook follows one skeleton, so a reader knows where to look in any of them.

- The opening cell (``# NN · Title``) says what the reader will learn (``**You will learn**``, a
  list) and how long the notebook takes (``**Expected time:**``).
- One cell tagged ``parameters`` (papermill's), with a ``DEVICE`` parameter where the notebook
  trains a model.
- Steps are ``## 1. ...``, ``## 2. ...``, numbered from 1 without gaps.
- No code cell is longer than `MAX_CODE_LINES`: model classes, callbacks and helpers live in the
  library, with docstrings and tests.
- ``## Summary`` is followed by a code cell that writes the summary from this run's ``metrics``,
  so no figure in it is from another run.
- The last cell is ``## Where to go next``, naming library functions the notebook used.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
MAX_CODE_LINES = 30
TRAINS_A_MODEL = ("02", "03", "04", "05", "06", "07", "08", "09")


def cells_of(path: Path) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb")), ids=lambda p: p.stem[:2])
def test_notebook_follows_the_skeleton(path):
    cells = cells_of(path)
    kind, opening = cells[0]
    assert kind == "markdown" and opening.startswith(f"# {path.stem[:2]} · "), "the opening cell is the title"
    assert "**You will learn**" in opening and re.search(r"\n[*-] ", opening), "the opening lists what it teaches"
    assert "**Expected time:**" in opening
    params = [src for kind, src in cells if kind == "code" and re.match(r"[A-Z_]+: ", src)]
    assert params, "a parameters cell (NAME: type = value  # what it is)"
    if path.stem[:2] in TRAINS_A_MODEL:
        assert re.search(r"^DEVICE: str = ", params[0], re.M), "a DEVICE parameter"
    steps = [int(m.group(1)) for kind, src in cells if kind == "markdown"
             for m in [re.match(r"## (\d+)\. ", src)] if m]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 3, f"steps numbered 1..n, got {steps}"
    long = [(i, src.count("\n") + 1) for i, (kind, src) in enumerate(cells)
            if kind == "code" and src.count("\n") + 1 > MAX_CODE_LINES]
    assert not long, f"code cells over {MAX_CODE_LINES} lines (cell index, lines): {long}"
    summary = [i for i, (kind, src) in enumerate(cells) if kind == "markdown" and src.startswith("## Summary")]
    assert len(summary) == 1, "one '## Summary' heading"
    kind, source = cells[summary[0] + 1]
    assert kind == "code" and "metrics" in source, "the summary is written from this run's metrics"
    kind, last = cells[-1]
    assert kind == "markdown" and last.startswith("## Where to go next")
    assert re.search(r"`(sok|sok_tutorial|data_gen)\.[\w.]+", last), "it names the library functions used"
