"""Class 5, continued: the runner's verl overrides composed against verl's own Hydra config tree.

Composing needs only hydra-core and verl's YAML files (verl installed without its dependencies is enough); it
never imports verl itself, so no torch or Ray is loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

from runctl.config.models import TrainConfig
from runctl.verl import CONFIG_NAME, verl_overrides
from services.validator.registry import Context, Verdict, check, fatal, ok, skip

PARALLEL = 5


class ComposeError(Exception):
    """verl's config tree refused an override."""


def verl_config_dir() -> Path | None:
    """verl's ``trainer/config`` folder, found without importing verl; None when verl is not installed."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    return folder if folder.is_dir() else None


def compose(config_dir: Path, overrides: list[str]) -> None:
    """Compose verl's trainer config with the overrides.

    Raises:
        ComposeError: an override names a key verl does not have, or does not parse.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            hydra_compose(CONFIG_NAME, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ComposeError(" ".join(str(e).split())) from e


def known_keys(config_dir: Path) -> frozenset[str]:
    """Every key path of verl's composed trainer config. Composing takes most of a second, so the result is kept
    in ``$RUNCTL_HOME/cache`` per verl version and config folder."""
    from importlib.metadata import version

    from runctl.home import home

    stamp = hashlib.sha256(f"{version('verl')}:{config_dir}".encode()).hexdigest()[:16]
    cache = home() / "cache" / f"verl-keys-{stamp}.json"
    try:
        return frozenset(json.loads(cache.read_text()))
    except (OSError, ValueError):
        pass
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        tree = OmegaConf.to_container(hydra_compose(CONFIG_NAME), resolve=False)
    keys = sorted(_paths(tree, ""))
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(keys))
    tmp.replace(cache)
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


def check_overrides(config_dir: Path, overrides: list[str]) -> None:
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
    keys = known_keys(config_dir)
    for override in parsed:
        if not override.is_add() and override.key_or_group not in keys:
            raise ComposeError(f"Could not override '{override.key_or_group}': verl's {CONFIG_NAME} has no such key.")


@check("verl.compose", PARALLEL, "a verl launch that dies on an override verl does not know", ["train"])
def verl_compose(ctx: Context) -> Verdict:
    c = ctx.config
    assert isinstance(c, TrainConfig)
    if c.engine != "verl":
        return skip(f"ENGINE={c.engine} does not launch verl")
    if c.training_mode == "async":
        return skip("the fully-async trainer's config tree is not composed yet")
    config_dir = verl_config_dir()
    if config_dir is None:
        return skip("verl's config files are not installed here (pip install --no-deps verl, plus hydra-core)")
    try:
        import hydra  # noqa: F401
    except ImportError:
        return skip("hydra-core is not installed here")
    overrides = verl_overrides(c, run_dir="/run")
    try:
        check_overrides(config_dir, overrides)
    except ComposeError as e:
        return fatal(f"verl's config refuses the generated overrides: {e}", "report it: runctl and verl disagree.")
    return ok(f"{len(overrides)} overrides compose against verl's {CONFIG_NAME} config")
