"""Class 2 (paths and data) and class 3 (model × tool parser × scaffold)."""

from __future__ import annotations

import os
from pathlib import Path

from runctl.config.models import EvalConfig, InferConfig, RunConfig, TrainConfig
from services.validator.registry import Context, Verdict, check, fatal, ok, skip, warn
from services.validator.rules import AGENTS_BY_SCAFFOLD, PARSERS_BY_FAMILY

PATHS = 2
MODEL = 3


def _inputs(config: RunConfig) -> list[tuple[str, str]]:
    """(key, path) of every input file or folder the run reads."""
    found: list[tuple[str, str | None]] = []
    if isinstance(config, TrainConfig):
        found += [("TRAIN_FILES", config.train_files), ("VAL_FILES", config.val_files)]
        found += [("EVAL_DATASET", config.eval_dataset if config.eval_on_checkpoint else None)]
    elif isinstance(config, EvalConfig):
        found += [("DATASET_PATH", config.dataset_path)]
    elif isinstance(config, InferConfig):
        found += [("INDEX_FILE", config.index_file), ("INSTANCES_FILE", config.instances_file)]
    return [(key, path) for key, path in found if path]


@check("paths.model", PATHS, "a run that dies when vLLM cannot load the model")
def model_folder(ctx: Context) -> Verdict:
    if ctx.config.engine == "fake":
        return skip("ENGINE=fake loads no model")
    path = Path(ctx.config.model_path)
    if not path.is_dir():
        return fatal(
            f"MODEL_PATH {path} is not a folder here: vLLM cannot load it.", "point MODEL_PATH at a model folder."
        )
    if not (path / "config.json").is_file():
        return fatal(f"{path} has no config.json: it is not a Hugging Face model folder.", "point at the model folder.")
    return ok(f"model folder {path} has config.json")


@check("paths.inputs", PATHS, "a run that fails when it first reads its task index")
def input_paths(ctx: Context) -> Verdict:
    if ctx.config.engine == "fake":
        return skip("ENGINE=fake reads no tasks")
    missing = [f"{key}={path}" for key, path in _inputs(ctx.config) if not Path(path).exists()]
    if missing:
        return fatal(f"not found: {', '.join(missing)}; the run would fail when it reads them.", "fix the paths.")
    return ok(f"{len(_inputs(ctx.config))} input path(s) exist")


@check("paths.output_writable", PATHS, "a run that trains for hours and cannot save its first checkpoint")
def output_writable(ctx: Context) -> Verdict:
    if ctx.config.output_dir is None:
        return skip("OUTPUT_DIR unset: the run folder goes under $RUNCTL_HOME")
    target = Path(ctx.config.output_dir)
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        return fatal(f"OUTPUT_DIR {target} cannot be written ({probe} is not writable).", "choose a writable folder.")
    return ok(f"OUTPUT_DIR {target} is writable")


@check(
    "model.tool_parser",
    MODEL,
    "zero parsed tool calls, so every trial fails and the run dies at step 0",
    needs_facts=True,
)
def tool_parser(ctx: Context) -> Verdict:
    assert ctx.facts is not None
    parser, family = ctx.config.tool_call_parser, ctx.facts.family
    allowed = PARSERS_BY_FAMILY.get(family)
    if allowed is None:
        return warn(
            f"no rule for model family {family!r}: TOOL_CALL_PARSER={parser} cannot be checked.",
            "make sure the parser reads this model's tool-call format, and add the family to the rules table.",
        )
    if parser not in allowed:
        return fatal(
            f"TOOL_CALL_PARSER={parser} does not read {family} models' tool calls: no tool call would parse.",
            f"use one of: {', '.join(sorted(allowed))}.",
        )
    return ok(f"TOOL_CALL_PARSER={parser} fits the {family} family")


@check("model.agent_name", MODEL, "a rollout that fails at its first trial with an unknown agent loop")
def agent_name(ctx: Context) -> Verdict:
    scaffold, name = ctx.config.scaffold, ctx.config.agent_name
    agents = AGENTS_BY_SCAFFOLD[scaffold]
    if name is None:
        return ok(f"SCAFFOLD={scaffold} with its default agent {agents[0]}")
    if name not in agents:
        return fatal(
            f"AGENT_NAME={name} is not an agent of SCAFFOLD={scaffold}: the first trial would fail.",
            f"use one of: {', '.join(agents)}, or change SCAFFOLD.",
        )
    return ok(f"AGENT_NAME={name} belongs to SCAFFOLD={scaffold}")
