"""The notebooks in notebooks/ run top to bottom in a real Jupyter kernel (nbclient), so they never rot; the
stored copies carry no outputs."""
from __future__ import annotations

import os
import re

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


# What each notebook must have computed, checked in its kernel after it ran: the notebooks show tables and
# plots, and keep their checks here rather than as asserts a reader has to skip.
CHECKS = {
    "quickstart.ipynb": """
assert sorted(str(m) for m in received) == [f"order {i}" for i in range(5)]
assert result.message_count == 1000 and by_partition["count"].sum() == 1000 and len(by_partition) == 4
assert completed == 1000 and admin.get_queue_runtime_properties("orders").active_message_count == 0
# the first partition's first five, in order: its numbers start at 1, or at 6 where the five orders went too
assert list(first.columns[:2]) == ["partition", "number"] and first["partition"].nunique() == 1
assert list(first["number"]) in ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
""",
    "topics-and-rules.ipynb": """
assert counts.to_dict() == {"everything": 3, "big-eu": 1, "refunds": 1}
assert big.str_application_properties["priority"] == "high"
assert [r.body for r in seen.collect()] == ["order 1", "order 2", "refund 7"]
""",
    "operations.ipynb": """
assert [g["active"] for g in growth] == [100 * (i + 1) for i in range(8)]
assert report.incoming_messages == 1600 and report.outgoing_messages == 800
assert sum(next(b for b in backlog if b.path == "ingest").partitions.values()) == 800
""",
}
RAW_SEQUENCE_NUMBER = re.compile(r"(?<![\w-])\d{15,}(?![\w-])")  # a partition in the top bits: 15+ digits


def _texts(cell) -> list[str]:
    return [output.get("text", "") + output.get("data", {}).get("text/plain", "") + output.get("data", {}).get(
        "text/html", "") for output in cell.get("outputs", [])]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, tmp_path, monkeypatch):
    """Each notebook runs, shows at least one plot and one HTML table, no raw sequence numbers, no Spark log
    lines, no asserts; then its checks pass in the same kernel."""
    monkeypatch.setenv("SPARKBUS_NAMESPACE", str(tmp_path / "ns"))
    book = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    assert not any("assert " in cell.source for cell in book.cells), name
    shown = len(book.cells)
    book.cells.append(nbformat.v4.new_code_cell(CHECKS[name]))
    NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}}).execute()
    errors = [output for cell in book.cells for output in cell.get("outputs", []) if output.output_type == "error"]
    assert not errors
    outputs = [output for cell in book.cells[:shown] for output in cell.get("outputs", [])]
    assert any("image/png" in output.get("data", {}) for output in outputs), "no plot"
    assert any("text/html" in output.get("data", {}) for output in outputs), "no HTML table"
    texts = [text for cell in book.cells[:shown] for text in _texts(cell)]
    assert not [t for t in texts if RAW_SEQUENCE_NUMBER.search(t)], "a raw sequence number is shown"
    assert not [t for t in texts if " WARN " in t or " INFO " in t], "Spark's log lines reach the notebook"
