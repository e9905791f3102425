"""Class 2 (paths and data) and class 3 (model × tool parser × scaffold)."""

from __future__ import annotations

import math
import os
import shutil
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from runctl.config.models import EvalConfig, InferConfig, RunConfig, TrainConfig
from runctl.errors import TaskError
from runctl.home import home
from services.validator.checks.common import train_config
from services.validator.registry import Context, Verdict, check, fatal, ok, skip, warn
from services.validator.rules import AGENTS_BY_SCAFFOLD, PARSERS_BY_FAMILY, TOOL_CALLS_BY_SCAFFOLD

if TYPE_CHECKING:
    from runctl.tasks import Task, TaskIndex

PATHS = 2
MODEL = 3
#: A verl FSDP checkpoint holds fp32 model shards (4 B/param) and two fp32 Adam moments (8 B/param).
CHECKPOINT_BYTES_PER_PARAM = 12
GIB = 1024**3
SHOWN = 3


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
    venv = ctx.config.venv_path
    if venv and not (Path(venv) / "bin" / "python").is_file():
        missing.append(f"VENV_PATH={venv} (it has no bin/python)")
    if missing:
        return fatal(f"not found: {', '.join(missing)}; the run would fail when it reads them.", "fix the paths.")
    return ok(f"{len(_inputs(ctx.config))} input path(s) exist")


def _index_keys(config: RunConfig) -> list[tuple[str, str]]:
    """(key, path) of the task indexes among the inputs (INSTANCES_FILE is a list of ids, not an index)."""
    return [(key, path) for key, path in _inputs(config) if key != "INSTANCES_FILE" and Path(path).exists()]


def _load_index(path: str) -> TaskIndex | TaskError:
    try:
        from runctl.tasks import load_index  # pydantic models for task.toml: only runs that read tasks pay

        return load_index(path)
    except TaskError as e:
        return e


def _indexes(ctx: Context) -> list[tuple[str, TaskIndex | TaskError]]:
    return [(key, ctx.memo(("index", path), partial(_load_index, path))) for key, path in _index_keys(ctx.config)]


def _shown(problems: list[str]) -> str:
    more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    return "; ".join(problems[:SHOWN]) + more


@check("paths.task_index", PATHS, "a run that starts the cluster, then fails reading an index it cannot parse")
def task_index(ctx: Context) -> Verdict:
    if ctx.config.engine == "fake":
        return skip("ENGINE=fake reads no tasks")
    loaded = _indexes(ctx)
    if not loaded:
        return skip("no task index on this machine (paths.inputs reports missing ones)")
    broken = [f"{key}: {result}" for key, result in loaded if isinstance(result, TaskError)]
    if broken:
        return fatal(_shown(broken), "fix the index; a folder of task folders or a parquet file with task_path works.")
    sizes = ", ".join(f"{key} {len(r.entries)}" for key, r in loaded if not isinstance(r, TaskError))
    return ok(f"task indexes parse ({sizes} tasks)")


def _layout_problems(ctx: Context, tasks: list[Task]) -> list[str]:
    c = ctx.config
    if c.backend == "local" or c.image_registry is not None or not c.image_build:
        return []
    return [
        f"{task.path}: no environment/Dockerfile and no [environment] docker_image"
        for task in tasks
        if task.environment_file is None and not task.config.environment.docker_image
    ]


def indexed_tasks(ctx: Context) -> list[Task]:
    """Every task that loads, across the run's readable indexes (shared by the layout and image checks)."""
    tasks: list[Task] = []
    for _, result in _indexes(ctx):
        if not isinstance(result, TaskError):
            tasks += ctx.memo(("tasks", str(result.source)), result.load_tasks)[0]
    return tasks


@check("paths.task_layout", PATHS, "trials that fail at set-up, one by one, on tasks that are not Harbor tasks")
def task_layout(ctx: Context) -> Verdict:
    if ctx.config.engine == "fake":
        return skip("ENGINE=fake reads no tasks")
    indexes = [result for _, result in _indexes(ctx) if not isinstance(result, TaskError)]
    if not indexes:
        return skip("no readable task index (paths.task_index says why)")
    tasks: list[Task] = []
    errors: list[str] = []
    for index in indexes:
        loaded, failed = ctx.memo(("tasks", str(index.source)), index.load_tasks)
        tasks += loaded
        errors += [str(e) for e in failed]
    errors += _layout_problems(ctx, tasks)
    if errors:
        return fatal(
            f"{len(errors)} of {len(tasks) + len(errors)} task(s) are not sound Harbor tasks: {_shown(errors)}",
            "fix those task folders, or drop them from the index.",
        )
    return ok(f"{len(tasks)} task folder(s) have the Harbor layout")


def output_root(config: RunConfig) -> Path:
    """Where the run writes: OUTPUT_DIR, else the runs folder under $RUNCTL_HOME."""
    return Path(config.output_dir) if config.output_dir else home() / "runs"


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _kept_checkpoints(c: TrainConfig) -> tuple[int | None, str]:
    """How many checkpoints the run keeps at most, and how that number was found (None: unbounded)."""
    saves = None
    if c.total_training_steps is not None:
        saves = 1 if c.save_freq == -1 else math.ceil(c.total_training_steps / max(c.save_freq, 1))
    if c.max_ckpt_to_keep is not None:
        kept = min(c.max_ckpt_to_keep, saves) if saves else c.max_ckpt_to_keep
        return kept, f"MAX_CKPT_TO_KEEP={c.max_ckpt_to_keep}"
    if saves is not None:
        return saves, f"{saves} saves over TOTAL_TRAINING_STEPS={c.total_training_steps}"
    return None, "MAX_CKPT_TO_KEEP unset"


@check(
    "paths.disk_space",
    PATHS,
    "a run that dies hours in, when a checkpoint no longer fits on disk",
    ["train"],
    needs_facts=True,
    live=True,
)
def disk_space(ctx: Context) -> Verdict:
    c = train_config(ctx)
    assert ctx.facts is not None
    if ctx.facts.num_params is None:
        return skip("config.json does not give the model's shape")
    root = output_root(c)
    free = shutil.disk_usage(_existing(root)).free / GIB
    each = ctx.facts.num_params * CHECKPOINT_BYTES_PER_PARAM / GIB
    kept, why = _kept_checkpoints(c)
    if each > free:
        return fatal(
            f"one checkpoint takes about {each:.1f} GiB but {root} has {free:.1f} GiB free: the first save fails.",
            "free space, or point OUTPUT_DIR at a bigger disk.",
        )
    if kept is None:
        return warn(
            f"{why}: every checkpoint is kept ({each:.1f} GiB each); {root} has room for {int(free // each)}.",
            "set MAX_CKPT_TO_KEEP so old checkpoints are removed.",
        )
    if kept * each > free:
        return fatal(
            f"{kept} checkpoints ({why}) take about {kept * each:.1f} GiB but {root} has {free:.1f} GiB free.",
            "lower MAX_CKPT_TO_KEEP, free space, or point OUTPUT_DIR at a bigger disk.",
        )
    return ok(f"{kept} checkpoints ({why}) ≈ {kept * each:.1f} GiB of {free:.1f} GiB free under {root}")


@check("paths.output_writable", PATHS, "a run that trains for hours and cannot save its first checkpoint")
def output_writable(ctx: Context) -> Verdict:
    if ctx.config.output_dir is None:
        return skip("OUTPUT_DIR unset: the run folder goes under $RUNCTL_HOME")
    target = Path(ctx.config.output_dir)
    probe = _existing(target)
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        return fatal(f"OUTPUT_DIR {target} cannot be written ({probe} is not writable).", "choose a writable folder.")
    return ok(f"OUTPUT_DIR {target} is writable")


def written_paths(config: RunConfig) -> dict[str, str | None]:
    """Key → path of every folder or file a run writes (beside its default run folder)."""
    written: dict[str, str | None] = {"OUTPUT_DIR": config.output_dir}
    if isinstance(config, InferConfig):
        written |= {"RESULTS_DIR": config.results_dir, "OUTPUT_INDEX": config.output_index}
    return written


@check("paths.team_area", PATHS, "a run that writes into, or deletes, another team's folders on shared storage")
def team_area(ctx: Context) -> Verdict:
    from runctl.layout import outside_team_areas, team_areas

    team = ctx.config.team
    areas = team_areas(team)
    if areas is None:
        return skip("this cluster confines no team to its own folders (RUNCTL_TEAM_PATHS unset)")
    outside = outside_team_areas(team, written_paths(ctx.config))
    if outside:
        return fatal(
            f"{', '.join(outside)}: outside team {team}'s folders on this cluster ({', '.join(map(str, areas))}).",
            "give absolute paths under one of them, or leave the keys unset (the run folder goes under the last).",
        )
    return ok(f"every folder the run writes is under team {team}'s")


@check(
    "model.tool_parser",
    MODEL,
    "zero parsed tool calls, so every trial fails and the run dies at step 0",
    needs_facts=True,
)
def tool_parser(ctx: Context) -> Verdict:
    assert ctx.facts is not None
    parser, family, scaffold = ctx.config.tool_call_parser, ctx.facts.family, ctx.config.scaffold
    if TOOL_CALLS_BY_SCAFFOLD[scaffold] == "text":
        return skip(f"SCAFFOLD={scaffold} parses its commands from the model's text: no tool call meets a parser")
    allowed = PARSERS_BY_FAMILY.get(family)
    if allowed is None:
        return warn(
            f"no rule for model family {family!r}: TOOL_CALL_PARSER={parser} cannot be checked.",
            "make sure the parser reads this model's tool-call format, and add the family to the rules table.",
        )
    if parser not in allowed:
        return fatal(
            f"TOOL_CALL_PARSER={parser} does not read {family} models' tool calls, and SCAFFOLD={scaffold}'s agent "
            "acts only through the calls it parses: no tool call would parse.",
            f"use one of: {', '.join(sorted(allowed))}.",
        )
    return ok(f"TOOL_CALL_PARSER={parser} fits the {family} family, whose calls SCAFFOLD={scaffold}'s agent reads")


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


@check("model.agent_bundle", MODEL, "every trial fails as it starts: the scaffold's agent is not on this machine")
def agent_bundle(ctx: Context) -> Verdict:
    from runctl import bundles

    scaffold, version = ctx.config.scaffold, ctx.config.agent_version
    if scaffold not in bundles.SPECS:
        if version is not None:
            return fatal(
                f"AGENT_VERSION={version} is set, but SCAFFOLD={scaffold} runs no bundled agent: it would be ignored.",
                f"remove AGENT_VERSION, or use a bundled scaffold ({', '.join(sorted(bundles.SPECS))}).",
            )
        return skip(f"SCAFFOLD={scaffold} runs no bundled agent")
    try:
        bundle = bundles.load(scaffold, version)
    except bundles.BundleError as e:
        return fatal(e.what, e.fix)
    return ok(f"SCAFFOLD={scaffold}: its bundle {bundle.version} is built for this platform ({bundle.sha256[:12]}…)")
