"""Every config the repository ships loads and validates."""

from __future__ import annotations

from pathlib import Path

import pytest

from runctl.config import load_config, resolve_text
from runctl.config.models import RUN_TYPES
from runctl.config.template import render_template
from runctl.errors import ConfigError
from tests.conftest import ROOT

EXAMPLES = sorted((ROOT / "configs" / "examples").glob("*.env"))
TEMPLATES = sorted((ROOT / "configs" / "templates").glob("*.env"))


def test_there_are_examples_and_one_template_per_run_type() -> None:
    assert EXAMPLES
    assert sorted(p.stem for p in TEMPLATES) == sorted(RUN_TYPES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates(path: Path) -> None:
    load_config(path, environ={})


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_templates_are_generated_and_need_only_their_placeholders(path: Path) -> None:
    text = path.read_text()
    assert text == render_template(path.stem, "my_run")  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        resolve_text(text, str(path), environ={})
    assert {i.code for i in info.value.issues} == {"schema.placeholder"}
    resolve_text(text.replace("CHANGEME", "x"), str(path), environ={})


def test_the_site_example_is_a_valid_lower_layer() -> None:
    site = ROOT / "configs" / "site.example.env"
    run = (ROOT / "configs" / "templates" / "train.env").read_text().replace("CHANGEME", "x")
    resolved = resolve_text(
        run, "train.env", site_text=site.read_text(), site_path=str(site), environ={"HOME": "/home/u"}
    )
    assert resolved.settings["BACKEND"].layer == "site"
    assert resolved.model.kubeconfig == "/home/u/.kube/config"
