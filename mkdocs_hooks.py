"""MkDocs hooks for the documentation site (``hooks:`` in ``mkdocs.yml``).

The docstrings cross-reference with Sphinx roles (``:class:`~stepwatch.Summary` ``), which mkdocstrings leaves as
they are: on the API reference they would read ``:class:Summary``. Each role becomes the name it refers to, as
code (``~`` keeps only the last part of a dotted name, as Sphinx does; ``Title <target>`` keeps the title).
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|meth|func|data|attr|mod|exc|obj):<code>(~?)([\w.]+)(?: &lt;[\w.]+&gt;)?</code>")


def shorten(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **_: Any) -> str:
    return ROLE.sub(shorten, html)
