"""The documentation: the MkDocs site builds with --strict (a broken link, a missing anchor or a page left
out of the navigation fails it); every example marked runnable in README.md and docs/ runs on its own in
an empty directory and prints the lines of its <!-- output --> block; README.md stays short and opens with
the hello world.

An example is runnable when the line before its ```python fence is exactly <!-- runnable -->. A ```text
block preceded by <!-- output --> belongs to the runnable example before it: each of its lines must be a
line of what the example prints."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
RUNNABLE = "<!-- runnable -->"
OUTPUT = "<!-- output -->"
FENCE = re.compile(r"^```(?P<language>[\w-]*)\s*$")
README_MAX_LINES = 260
SPARK_WORDS = ("pyspark", "SparkSession", "get_spark")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a Markdown file."""

    path: Path
    line: int  # the opening fence's line, from 1
    language: str
    code: str
    runnable: bool
    output: tuple[str, ...] = ()  # lines the example must print (its <!-- output --> block)

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def starts_spark(self) -> bool:
        return any(word in self.code for word in SPARK_WORDS)


def code_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file (fences at the start of a line), with their markers applied."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        assert end < len(lines), f"{path.relative_to(REPO)}:{i + 1}: the code block is never closed"
        marker = lines[i - 1].strip() if i > 0 else ""
        block = Block(path, i + 1, opening["language"], "\n".join(lines[i + 1:end]) + "\n", marker == RUNNABLE)
        if marker == RUNNABLE:
            assert block.language == "python", f"{block.name}: only python blocks can be runnable"
        if marker == OUTPUT:
            assert block.language == "text", f"{block.name}: an output block is a ```text block"
            runnable = [b for b in blocks if b.language == "python"]
            assert runnable and runnable[-1].runnable, f"{block.name}: an output block follows a runnable example"
            expected = tuple(line for line in block.code.split("\n") if line.strip())
            blocks[blocks.index(runnable[-1])] = Block(**{**runnable[-1].__dict__, "output": expected})
        blocks.append(block)
        i = end + 1
    return blocks


def documentation_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def runnable_blocks() -> list[Block]:
    """The runnable examples, each code once (index.md repeats the README's hello world: one run covers both)."""
    unique: dict[str, Block] = {}
    for path in documentation_files():
        for block in code_blocks(path):
            if block.runnable and block.code not in unique:
                unique[block.code] = block
            elif block.runnable and block.output:
                assert set(block.output) <= set(unique[block.code].output), f"{block.name}: the same example's output"
    return list(unique.values())


def _param(block: Block):
    return pytest.param(block, id=block.name, marks=[pytest.mark.slow] if block.starts_spark else [])


RUNNABLE_BLOCKS = runnable_blocks()


def test_the_site_builds_with_strict_checks(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-5000:]}\n{done.stderr[-10000:]}"
    assert (site / "index.html").is_file()
    assert (site / "reference" / "api" / "index.html").is_file()
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="sparkbus.ServiceBusClient"' in api and 'id="sparkbus.ServiceBusAdministrationClient"' in api


# The README's hello world runs in tests/test_packaging.py, from the installed wheel in an empty directory.
@pytest.mark.parametrize("block", [_param(block) for block in RUNNABLE_BLOCKS if block.path != README])
def test_a_runnable_example_runs_in_an_empty_directory(block, tmp_path):
    script = tmp_path / "script" / "example.py"
    script.parent.mkdir()
    script.write_text(f"# {block.name}\n{block.code}", encoding="utf-8")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900 if block.starts_spark else 300)
    assert done.returncode == 0, (f"{block.name} exited {done.returncode}\n--- stdout\n{done.stdout[-5000:]}"
                                  f"\n--- stderr\n{done.stderr[-10000:]}")
    printed = done.stdout.splitlines()
    missing = [line for line in block.output if line not in printed]
    assert not missing, f"{block.name} did not print {missing}; it printed:\n{done.stdout[-5000:]}"


def test_the_readme_is_short_and_opens_with_the_runnable_hello_world():
    lines = README.read_text(encoding="utf-8").split("\n")
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    first = next(block for block in code_blocks(README) if block.language == "python")
    assert first.runnable, f"{first.name}: the README's first python block is the runnable hello world"
    for call in ("create_namespace(", "create_queue(", "create_topic(", "create_subscription(", "send_messages(",
                 "get_queue_receiver(", "complete_message(", "fanout_once(", "get_subscription_receiver(",
                 'SparkSession.builder.master("local[2]")'):
        assert call in first.code, f"{first.name}: the hello world shows {call}"
    assert len(first.code.splitlines()) <= 30, f"{first.name}: the hello world stays about 20 lines"
    assert first.output, f"{first.name}: the hello world says what it prints (an <!-- output --> block)"
    assert first in RUNNABLE_BLOCKS


def test_examples_pass_max_wait_time_to_every_receive():
    """A receive without max_wait_time waits until a message arrives, as in azure-servicebus: the examples
    never rely on that."""
    calls = re.compile(r"\.(receive_messages|receive_dataframe|get_queue_receiver|get_subscription_receiver)\(")
    unbounded = [f"{block.name}: {line.strip()}"
                 for path in documentation_files() for block in code_blocks(path) if block.language == "python"
                 for line in block.code.splitlines() if calls.search(line) and "max_wait_time=" not in line]
    assert not unbounded, "receives without max_wait_time:\n" + "\n".join(unbounded)


def test_there_are_runnable_examples_and_few_start_spark():
    assert len(RUNNABLE_BLOCKS) >= 5
    assert sum(block.starts_spark for block in RUNNABLE_BLOCKS) <= 4, "Spark examples take ~15 s each"


def test_the_readme_links_to_files_that_exist():
    """The README's map of the documentation (MkDocs checks the links inside docs/, not the README's)."""
    text = README.read_text(encoding="utf-8")
    targets = [target.split("#", 1)[0] for target in re.findall(r"\]\(([^)\s]+)\)", text)
               if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]
    assert targets, "the README links to the documentation"
    broken = [target for target in targets if not (REPO / target).exists()]
    assert not broken, f"README.md links to missing files: {broken}"
    for page in sorted(DOCS.glob("*.md")) + sorted(DOCS.glob("*/*.md")):
        assert f"]({page.relative_to(REPO).as_posix()})" in text, f"README.md's map lacks {page.relative_to(REPO)}"


def test_the_invalid_inputs_table_is_test_data():
    """tests/test_invalid_inputs.py runs every row of docs/reference/invalid-inputs.md: its rows keep that
    test's form (documented_calls asserts it)."""
    from test_invalid_inputs import documented_calls

    assert len(documented_calls()) > 100
