"""The notebooks in notebooks/ run top to bottom in a real Jupyter kernel (nbclient), so they never rot; the
stored copies carry no outputs."""
from __future__ import annotations

import os

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")
NAMES = sorted(n for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb"))


def test_the_three_notebooks_are_there_without_outputs():
    assert NAMES == ["operations.ipynb", "quickstart.ipynb", "topics-and-rules.ipynb"]
    for name in NAMES:
        book = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
        code = [cell for cell in book.cells if cell.cell_type == "code"]
        assert code and all(not cell.outputs and cell.execution_count is None for cell in code), name


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKBUS_NAMESPACE", str(tmp_path / "ns"))
    book = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}}).execute()
    errors = [output for cell in book.cells for output in cell.get("outputs", []) if output.output_type == "error"]
    assert not errors
    assert any(output.get("data", {}).get("image/png") for cell in book.cells for output in cell.get("outputs", [])) \
        == (name == "operations.ipynb")  # the operations notebook draws its plots
