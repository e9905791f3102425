"""Run configs: the ``.env`` parser, the models of the three run types, layering and templates."""

from runctl.config.loader import LAYERS, ResolvedConfig, Setting, load_config, resolve_text
from runctl.config.models import RUN_TYPES, EvalConfig, InferConfig, RunConfig, RunType, TrainConfig

__all__ = [
    "LAYERS",
    "RUN_TYPES",
    "EvalConfig",
    "InferConfig",
    "ResolvedConfig",
    "RunConfig",
    "RunType",
    "Setting",
    "TrainConfig",
    "load_config",
    "resolve_text",
]
