"""MkDocs hook: a pipe written `\\|` inside a code span of a table renders as `|` on the site too.

It exists because the same Markdown is read in two places: GitHub needs `\\|` for a pipe inside a code span in a
table cell (or it splits the cell there), while Python-Markdown's tables extension already keeps code spans whole
and would print the backslash. Only table rows outside fenced blocks are touched.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def unescape_table_pipes(markdown: str) -> str:
    lines, fenced = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|"):
            line = _CODE_SPAN.sub(lambda m: m.group(1) + m.group(2).replace("\\|", "|") + m.group(1), line)
        lines.append(line)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - MkDocs' hook signature
    return unescape_table_pipes(markdown)
