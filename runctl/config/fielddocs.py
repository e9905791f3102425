"""The help text of every config key: the docstring written under its field in ``models.py``.

Read from the source with ``ast`` when first asked (templates, the README, error messages), not when the models
are defined: pydantic's ``use_attribute_docstrings`` does the same work for every model at import, which doubled
the cost of importing the config models on every ``runctl`` start.
"""

from __future__ import annotations

import ast
import inspect
from functools import cache

from pydantic import BaseModel


@cache
def _docs_by_class() -> dict[str, dict[str, str]]:
    from runctl.config import models

    tree = ast.parse(inspect.getsource(models))
    docs: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields: dict[str, str] = {}
        for statement, following in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                fields[statement.target.id] = inspect.cleandoc(following.value.value)
        docs[node.name] = fields
    return docs


def field_doc(model: type[BaseModel], field: str) -> str:
    """The docstring of ``field`` as ``model`` (or the nearest class it inherits it from) defines it, on one line."""
    docs = _docs_by_class()
    for cls in model.__mro__:
        text = docs.get(cls.__name__, {}).get(field)
        if text is not None:
            return " ".join(text.split())
    return ""
