"""A stand-in for an agent's bundle (runctl.bundles): mswea's default version with a manifest of this platform and
format, an "interpreter" that is a shell script, and a prompt where given. Real bundles:
tests/integration/test_scaffolds.py."""

from __future__ import annotations

import json
from pathlib import Path

from runctl import bundles


def fake_bundle(root: Path, prompt: str | None = None, interpreter: str = "#!/bin/sh\n", **manifest: object) -> Path:
    """The bundle's folder under ``root``; ``manifest`` keys replace the made ones (its ``sha256`` is the folder's)."""
    folder = bundles.bundle_path("mswea", root=root)
    (folder / "runtime" / "bin").mkdir(parents=True)
    (folder / "runtime" / "bin" / "python3.11").write_text(interpreter)
    if prompt is not None:
        (folder / bundles.PROMPT).write_text(prompt)
    doc = {
        "format": bundles.FORMAT,
        "name": "mswea",
        "version": "2.4.6",
        "platform": bundles.platform_tag(),
        "python": "runtime/bin/python3.11",
        "python_lib": "runtime/lib",
    }
    doc |= manifest
    doc.setdefault("sha256", bundles.tree_hash(folder))
    (folder / bundles.MANIFEST).write_text(json.dumps(doc))
    return folder
