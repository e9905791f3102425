"""Generate what is written from code, not by hand: config templates, the README's config table and event catalogue,
and the services' settings tables in docs/services.md.

python scripts/gen_docs.py           # rewrite them
python scripts/gen_docs.py --check   # exit 1 if any is stale (a test runs this)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from runctl.config.models import RUN_TYPES
from runctl.config.template import render_reference_table, render_template
from runctl.events.payloads import PAYLOADS

ROOT = Path(__file__).resolve().parent.parent


def event_catalogue() -> str:
    rows = ["| event | CloudEvents type | stream | published by | payload fields |", "|---|---|---|---|---|"]
    for payload in PAYLOADS:
        fields = ", ".join(f"`{name}`" for name in payload.model_fields)
        name, kind = f"`{payload.event_name}`", f"`{payload.type_string()}`"
        rows.append(f"| {name} | {kind} | {payload.stream} | {payload.publisher} | {fields} |")
    return "\n".join(rows) + "\n"


def check_table() -> str:
    from services.validator.library import registered

    rows = ["| check | class | applies to | prevents |", "|---|---|---|---|"]
    rows.append(
        "| `schema.*` (unknown_key, placeholder, value, required, cross_field, syntax, …) | 1 | all | "
        "a config that does not mean what its author thinks: typos, leftovers, wrong types |"
    )
    for check in registered():
        applies = "all" if len(check.run_types) == 3 else ", ".join(sorted(check.run_types))
        needs = " (reads the model's config.json)" if check.needs_facts else ""
        needs += " (live probe; skipped with --static)" if check.live else ""
        rows.append(f"| `{check.id}` | {check.check_class} | {applies} | {check.prevents}{needs} |")
    return "\n".join(rows) + "\n"


#: Each service's settings model, as (service, module, class).
SETTINGS = [
    ("launcher", "services.launcher.settings", "LauncherSettings"),
    ("proxy", "services.proxy.settings", "ProxySettings"),
    ("sandbox", "services.sandbox.settings", "SandboxSettings"),
    ("tracker", "services.tracker.settings", "TrackerSettings"),
    ("validator", "services.validator.settings", "ValidatorSettings"),
]


def settings_table(module: str, name: str) -> str:
    import importlib

    model = getattr(importlib.import_module(module), name)
    rows = ["| variable | default | what it is |", "|---|---|---|"]
    rows += [f"| `{var}` | `{default}` | {doc.replace('``', '`')} |" for var, default, doc in model.documented()]
    return "\n".join(rows) + "\n"


def _splice(text: str, marker: str, body: str, where: str = "README.md") -> str:
    pattern = re.compile(rf"(<!-- {marker}:start -->\n).*?(<!-- {marker}:end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{where} lacks the <!-- {marker}:start/end --> markers")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


def expected() -> dict[Path, str]:
    files = {ROOT / "configs" / "templates" / f"{t}.env": render_template(t, "my_run") for t in RUN_TYPES}
    readme = ROOT / "README.md"
    text = readme.read_text()
    text = _splice(text, "config-table", render_reference_table())
    text = _splice(text, "event-catalogue", event_catalogue())
    text = _splice(text, "check-table", check_table())
    files[readme] = text
    services_doc = ROOT / "docs" / "services.md"
    text = services_doc.read_text()
    for service, module, name in SETTINGS:
        text = _splice(text, f"settings-{service}", settings_table(module, name), "docs/services.md")
    files[services_doc] = text
    return files


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for path, content in expected().items():
        if path.exists() and path.read_text() == content:
            continue
        stale.append(path)
        if not check:
            path.write_text(content)
    if check and stale:
        names = ", ".join(str(p.relative_to(ROOT)) for p in stale)
        print(f"stale generated files: {names}. Fix: python scripts/gen_docs.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
