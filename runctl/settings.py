"""The base of every service's settings: a pydantic-settings model read from the process's environment.

Each service keeps its settings in ``services/<svc>/settings.py``: one model, a docstring under each field (what it
is, its unit), read once when the process starts (:meth:`ServiceSettings.from_env`) and handed to the code that needs
it. ``docs/services.md``'s settings tables are generated from those docstrings (``scripts/gen_docs.py``), as the
README's config table is from the run config's. A value that is not what its field takes stops the service at
start-up with the variable named and the fix, never later and never silently.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Self

from pydantic import ValidationError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from runctl.errors import RunctlError

__all__ = ["NoDecode", "ServiceSettings", "SettingsError", "comma_list"]


class SettingsError(RunctlError):
    """A service's environment holds a value its settings cannot take."""


class ServiceSettings(BaseSettings):
    """Settings from the environment: ``env_prefix`` + the field's name in upper case, or the field's alias (for
    variables other tools read too: ``RAY_ADDRESS``, ``DOCKER_HOST``). An empty variable counts as unset."""

    model_config = SettingsConfigDict(extra="ignore", env_ignore_empty=True, frozen=True)

    @classmethod
    def from_env(cls) -> Self:
        """The settings this process's environment gives.

        Raises:
            SettingsError: a variable's value is not what its field takes; names each and its fix.
        """
        try:
            return cls()
        except ValidationError as e:
            problems = []
            for error in e.errors():
                field = str(error["loc"][0]) if error["loc"] else ""
                name = cls.env_name(field) if field in cls.model_fields else field
                problems.append(f"{name}={error.get('input')!r}: {error['msg']}")
            raise SettingsError(
                f"{cls.__name__}: " + "; ".join(problems) + ". Fix: correct or unset the variable(s) named "
                "(docs/services.md lists each setting with its default)."
            ) from None

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable a field is read from."""
        info = cls.model_fields[field]
        if isinstance(info.validation_alias, str):
            return info.validation_alias
        return f"{cls.model_config.get('env_prefix', '')}{field}".upper()

    @classmethod
    def documented(cls) -> Iterator[tuple[str, str, str]]:
        """(variable, default, what it is) for each field, from the docstring under it."""
        from runctl.config.fielddocs import field_doc

        for field, info in cls.model_fields.items():
            default = "unset" if info.default is None else _shown(info.default)
            yield cls.env_name(field), default, field_doc(cls, field)


def _shown(value: Any) -> str:
    if value == math.inf:
        return "unset"
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or "empty"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "empty"
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value) if value != "" else "empty"


def comma_list(value: Any) -> Any:
    """A field validator's parse of ``a,b , c`` into ``["a", "b", "c"]`` (a list given as such passes as it is)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value
