"""Config templates and the README's config table, generated from the field docstrings."""

from __future__ import annotations

import textwrap

from runctl.config.fielddocs import field_doc
from runctl.config.models import MODELS, RUN_TYPES, SECTIONS, RunType, Section, all_keys, section_keys

_HIDDEN_IN_TEMPLATES = {"PREFLIGHT_ONLY", "DRY_RUN", "PARENT_RUN", "CHECKPOINT_STEP"}


def _doc(section: type[Section], key: str) -> str:
    return field_doc(section, key.lower())


def _default_text(run_type: RunType, key: str) -> str | None:
    info = MODELS[run_type].model_fields[key.lower()]
    if info.is_required():
        return None
    default = info.get_default(call_default_factory=True)
    if default is None:
        return ""
    if isinstance(default, bool):
        return "1" if default else "0"
    return str(default)


def render_template(run_type: RunType, name: str) -> str:
    """An ``.env`` template for a new run: required keys as CHANGEME, the rest commented out with defaults.

    Args:
        run_type: train, eval or infer.
        name: the experiment name written as EXP_NAME.
    """
    lines = [
        f"# runctl {run_type} config — written by `runctl init {run_type} {name}`.",
        "# Parsed as data, never executed: KEY=VALUE, quotes, ${VAR} and ${VAR:-default}.",
        f"# Check it with `runctl validate {name}.env`, launch it with `runctl submit {name}.env`.",
        "# Keys left commented keep the default shown.",
        "",
    ]
    for section in SECTIONS[run_type]:
        keys = [k for k in section_keys(section) if k not in _HIDDEN_IN_TEMPLATES]
        if not keys:
            continue
        lines.append(f"# ---- {section.title} ----")
        for key in keys:
            for doc_line in textwrap.wrap(_doc(section, key), 110):
                lines.append(f"# {doc_line}")
            default = _default_text(run_type, key)
            extra = section.model_fields[key.lower()].json_schema_extra
            if isinstance(extra, dict) and "in_template" in extra:
                lines.append(f"{key}={extra['in_template']}")
            elif key == "RUN_TYPE":
                lines.append(f"RUN_TYPE={run_type}")
            elif key == "EXP_NAME":
                lines.append(f"EXP_NAME={name}")
            elif default is None:
                lines.append(f"{key}=CHANGEME")
            else:
                lines.append(f"# {key}={default}")
        lines.append("")
    return "\n".join(lines)


def render_reference_table() -> str:
    """The README's config reference: every key, the run types it applies to, its default and its docstring."""
    rows = ["| key | run types | default | meaning |", "|---|---|---|---|"]
    seen: set[str] = set()
    applies = all_keys()
    for run_type in RUN_TYPES:
        for section in SECTIONS[run_type]:
            for key in section_keys(section):
                if key in seen:
                    continue
                seen.add(key)
                types = applies[key]
                defaults = {t: _shown_default(t, key) for t in types}
                docs = {t: _doc(_section_of(t, key), key).replace("|", "\\|") for t in types}
                rows.append(f"| `{key}` | {', '.join(types)} | {_per_type(defaults)} | {_per_type(docs, ' ')} |")
    return "\n".join(rows) + "\n"


def _shown_default(run_type: RunType, key: str) -> str:
    default = _default_text(run_type, key)
    if default is None or key == "RUN_TYPE":
        return "*required*"
    return f"`{default}`" if default else "unset"


def _section_of(run_type: RunType, key: str) -> type[Section]:
    return next(s for s in SECTIONS[run_type] if key in section_keys(s))


def _per_type(values: dict[RunType, str], sep: str = "; ") -> str:
    """One value when every run type agrees, else ``eval: …; infer: …``."""
    distinct = set(values.values())
    if len(distinct) == 1:
        return distinct.pop()
    return sep.join(f"*{run_type}:* {value}" for run_type, value in values.items())
