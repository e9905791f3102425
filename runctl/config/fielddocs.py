"""The help text of every config key (and of every service setting): the docstring written under its field.

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
def _docs_by_class(module_name: str) -> dict[str, dict[str, str]]:
    """Per class of the module: each field's docstring, as written under it."""
    import sys

    tree = ast.parse(inspect.getsource(sys.modules[module_name]))
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
    for cls in model.__mro__:
        if not cls.__module__.startswith(("runctl.", "services.")):
            continue  # pydantic's own classes: no field of ours is documented there
        text = _docs_by_class(cls.__module__).get(cls.__name__, {}).get(field)
        if text is not None:
            return " ".join(text.split())
    return ""
