"""What a notebook (or IPython) shows for stepwatch's values: ``_repr_html_`` and ``_repr_pretty_`` of a
:class:`~stepwatch.Summary`, an :class:`~stepwatch.AllRanks` and a comparison look their renderers up here.

The renderers register themselves (``_render.notebook``, imported with ``_render`` when stepwatch is), so the
data modules never import the renderers: the data still flows one way, record -> summarize -> analyze -> render.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_renderers: dict[type, tuple[Callable[[Any], str], Callable[[Any], str]]] = {}
"""type -> (its text, its HTML fragment)."""


def register(kind: type, text: Callable[[Any], str], html: Callable[[Any], str]) -> None:
    _renderers[kind] = (text, html)


def _renderer(value: object) -> tuple[Callable[[Any], str], Callable[[Any], str]]:
    for kind in type(value).__mro__:
        found = _renderers.get(kind)
        if found is not None:
            return found
    raise TypeError(f"no renderer registered for {type(value).__name__}")


def text_of(value: object) -> str:
    """The text report of ``value``."""
    return _renderer(value)[0](value)


def html_of(value: object) -> str:
    """The HTML fragment a notebook shows for ``value``: self-contained, its style scoped to it, no plots."""
    return _renderer(value)[1](value)


def pretty(value: object, printer: Any, cycle: bool) -> None:
    """IPython's pretty printer (``_repr_pretty_``): the text report, as ``print(value.render())`` shows it."""
    if cycle:
        printer.text(f"<stepwatch {type(value).__name__}>")
        return
    printer.text(text_of(value).rstrip("\n"))
