"""Class 5, continued: the runner's verl overrides composed against verl's own Hydra config tree.

Composing needs only hydra-core and verl's YAML files (verl installed without its dependencies is enough); it
never imports verl itself, so no torch or Ray is loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from runctl.config.models import TrainConfig
from runctl.home import write_atomic
from runctl.verl import CONFIG_FOLDER, CONFIG_NAME, config_source, verl_overrides
from services.validator.registry import Context, Verdict, check, fatal, ok, skip

PARALLEL = 5


class ComposeError(Exception):
    """verl's config tree refused an override."""


def verl_config_dir(folder: str = CONFIG_FOLDER) -> Path | None:
    """A config folder of verl's (``trainer/config`` unless told), found without importing verl; None when verl
    is not installed."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(next(iter(spec.submodule_search_locations))) / folder
    return found if found.is_dir() else None


def _composed(config_dir: Path, name: str, overrides: list[str]) -> Any:
    """verl's config ``name`` from ``config_dir``. A config that extends verl's trainer tree names it as a package
    (``pkg://verl.trainer.config``, which imports verl and torch): it is given as a folder instead."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    base = config_dir.parent.parent.parent / CONFIG_FOLDER
    if name != CONFIG_NAME and base.is_dir():
        overrides = [f"hydra.searchpath=[file://{base}]", *overrides]
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose(name, overrides=overrides)


def compose(config_dir: Path, overrides: list[str], name: str = CONFIG_NAME) -> Any:
    """verl's trainer config ``name`` composed with the overrides.

    Raises:
        ComposeError: an override names a key verl does not have, or does not parse.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return _composed(config_dir, name, overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ComposeError(" ".join(str(e).split())) from e


def known_keys(config_dir: Path, name: str = CONFIG_NAME) -> frozenset[str]:
    """Every key path of verl's composed trainer config. Composing takes most of a second, so the result is kept
    in ``$RUNCTL_HOME/cache`` per verl version and config folder."""
    from importlib.metadata import version

    from runctl.home import home

    stamp = hashlib.sha256(f"{version('verl')}:{config_dir}:{name}".encode()).hexdigest()[:16]
    cache = home() / "cache" / f"verl-keys-{stamp}.json"
    try:
        return frozenset(json.loads(cache.read_text()))
    except (OSError, ValueError):
        pass
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(_composed(config_dir, name, []), resolve=False)
    keys = sorted(_paths(tree, ""))
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(cache, json.dumps(keys))
    return frozenset(keys)


def _paths(node: object, prefix: str) -> list[str]:
    if not isinstance(node, dict):
        return []
    found: list[str] = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        found.append(path)
        found.extend(_paths(value, f"{path}."))
    return found


def check_overrides(config_dir: Path, overrides: list[str], name: str = CONFIG_NAME) -> None:
    """What Hydra's composition would refuse, without composing: grammar, and keys verl's tree lacks.

    Raises:
        ComposeError: the first override that does not parse or names an unknown key.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ComposeError(" ".join(str(e).split())) from e
    keys = known_keys(config_dir, name)
    for override in parsed:
        if not override.is_add() and override.key_or_group not in keys:
            raise ComposeError(f"Could not override '{override.key_or_group}': verl's {name} has no such key.")


@check("verl.compose", PARALLEL, "a verl launch that dies on an override verl does not know", ["train"])
def verl_compose(ctx: Context) -> Verdict:
    c = ctx.config
    assert isinstance(c, TrainConfig)
    if c.engine != "verl":
        return skip(f"ENGINE={c.engine} does not launch verl")
    folder, name = config_source(c)
    config_dir = verl_config_dir(folder)
    if config_dir is None:
        return skip("verl's config files are not installed here (pip install --no-deps verl, plus hydra-core)")
    try:
        import hydra  # noqa: F401
    except ImportError:
        return skip("hydra-core is not installed here")
    overrides = verl_overrides(c, run_dir="/run")
    try:
        check_overrides(config_dir, overrides, name)
    except ComposeError as e:
        return fatal(f"verl's config refuses the generated overrides: {e}", "report it: runctl and verl disagree.")
    return ok(f"{len(overrides)} overrides compose against verl's {name} config")
