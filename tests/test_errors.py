"""The exception tree drawn in ``spotwise.errors``'s docstring is the tree the classes form: a
class added, moved or given another builtin base without redrawing it fails here."""

from __future__ import annotations

import inspect

import spotwise.errors as errors
from spotwise.errors import SpotwiseError


def _drawn(cls: type, depth: int, classes: list[type]) -> list[str]:
    also = [base.__name__ for base in cls.__bases__[1:]]
    line = "    " + "  " * depth + cls.__name__ + (f" (also {', '.join(also)})" if also else "")
    children = [c for c in classes if c.__bases__[0] is cls]
    return [line] + [row for child in children for row in _drawn(child, depth + 1, classes)]


def test_the_docstring_draws_every_class_where_it_sits() -> None:
    classes = [
        c
        for c in vars(errors).values()
        if inspect.isclass(c) and issubclass(c, SpotwiseError) and c.__module__ == errors.__name__
    ]
    tree = "\n".join(_drawn(SpotwiseError, 0, classes))
    assert tree in (errors.__doc__ or ""), tree
    assert tree.count("\n") + 1 == len(classes)  # each class once, none beside the tree
