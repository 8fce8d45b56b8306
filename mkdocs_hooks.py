"""MkDocs hooks of the documentation site (mkdocs.yml `hooks:`).

The invalid-inputs table (docs/reference/invalid-inputs.md) is also test data: tests/test_invalid_inputs.py
reads each row's "message says" cell as written and checks that the error's text contains it. Some of
those cells hold Python subscripts such as `value_body[0][0]`, which Markdown reads as a reference link
and mkdocs-autorefs then reports as an unknown cross-reference (a warning, so --strict fails). The
page's source stays as the test needs it; only the text handed to Markdown has those brackets escaped,
which renders them exactly as written.
"""
from __future__ import annotations

import re

INVALID_INPUTS = "reference/invalid-inputs.md"
START, END = "<!-- invalid-inputs:start -->", "<!-- invalid-inputs:end -->"
ROW = re.compile(r"^(?P<head>\| `.+` \| \w+ \| )(?P<says>.*?)(?P<tail> ?\|)$")


def _escaped(line: str) -> str:
    match = ROW.match(line)
    if match is None:
        return line
    says = match["says"].replace("[", r"\[").replace("]", r"\]")
    return match["head"] + says + match["tail"]


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != INVALID_INPUTS or START not in markdown:
        return markdown
    before, rest = markdown.split(START, 1)
    table, after = rest.split(END, 1)
    return before + START + "\n".join(_escaped(line) for line in table.split("\n")) + END + after
