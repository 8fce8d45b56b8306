"""The notebooks in the documentation site with their tables and plots: `make docs` runs each notebook of
notebooks/ top to bottom in a Jupyter kernel (nbclient, as tests/test_notebooks.py does), each on a namespace
of its own in a temporary directory, and writes the executed copy to docs/notebooks/, which the site renders
(mkdocs-jupyter). notebooks/ keeps the copies without outputs that people open and run. The kernels' own
stderr (the JVM's and ipykernel's start-up notices) is left out of the build's output; a failing cell still
fails the build (nbclient raises with the cell's error)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import tempfile

import nbformat
from nbclient import NotebookClient

TOP = pathlib.Path(__file__).resolve().parent
SOURCE, TARGET = TOP / "notebooks", TOP / "docs" / "notebooks"


def main() -> None:
    TARGET.mkdir(exist_ok=True)
    for path in sorted(SOURCE.glob("*.ipynb")):
        book = nbformat.read(path, as_version=4)
        with tempfile.TemporaryDirectory() as top:
            os.environ["SPARKBUS_NAMESPACE"] = f"{top}/ns"
            NotebookClient(book, timeout=600, kernel_name="python3",
                           resources={"metadata": {"path": str(SOURCE)}}).execute(stderr=subprocess.DEVNULL)
        for cell in book.cells:  # (run times and kernel details change every build)
            cell.get("metadata", {}).pop("execution", None)
        book.metadata.pop("widgets", None)
        nbformat.write(book, TARGET / path.name)
        print(f"wrote {TARGET / path.name}")


if __name__ == "__main__":
    main()
