"""One validation check's outcome: what ``config.validated`` and ``config.rejected`` carry, one per check.

Its own module so that `runctl validate` loads this one model, not the whole event catalogue.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Severity = Literal["ok", "warn", "fatal", "skip"]


class CheckResult(BaseModel):
    """One validation check's outcome."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str
    check_class: int = Field(ge=1, le=9)
    severity: Severity
    message: str
    fix: str = ""
