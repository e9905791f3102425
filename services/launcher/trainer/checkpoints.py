"""Checkpoints of a train run, in its folder:

    trainer/state/checkpoint-<N>/    the resume point, written by TRL after every step (weights, optimizer,
                                     scheduler, RNG states, trainer state with the data order); only the newest kept
    checkpoints/global_step_<N>/     a published checkpoint (every SAVE_FREQ steps and the last step):
        huggingface/                 config, weights, tokenizer, chat template: loads as MODEL_PATH in transformers
                                     and vLLM (an eval run of this checkpoint serves it)
        trainer/                     the resume point of that step, as TRL wrote it

Files are hard links of the resume point's (copies where the filesystem cannot link), so a published checkpoint
costs no second copy of the weights. ``MAX_CKPT_TO_KEEP`` keeps the newest published checkpoints; one whose eval run
has not ended is kept whatever its age (``prune`` is told which), and pruned once that eval ends.

verl's checkpoints (ENGINE=verl) share the ``global_step_<N>`` folders, with their Hugging Face folder at
``actor/huggingface`` (``VERL_HF``); ``hf_of`` gives a config's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

from runctl.config.models import TrainConfig

STATE_DIR = Path("trainer") / "state"
CHECKPOINTS = "checkpoints"
HF = "huggingface"
VERL_HF = Path("actor") / HF
#: The files of a Hugging Face model folder among those TRL writes into a checkpoint.
HF_FILES = re.compile(
    r"^(config\.json|generation_config\.json|model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json|"
    r"tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|chat_template\.jinja|vocab\.json|merges\.txt)$"
)
_STEP = re.compile(r"^checkpoint-(\d+)$")
_PUBLISHED = re.compile(r"^global_step_(\d+)$")


def state_dir(run_dir: Path) -> Path:
    return run_dir / STATE_DIR


def resume_points(run_dir: Path) -> dict[int, Path]:
    """Complete resume points by step (TRL writes into a temporary name and renames when done)."""
    found = {}
    folder = state_dir(run_dir)
    if folder.is_dir():
        for child in folder.iterdir():
            m = _STEP.match(child.name)
            if m and (child / "trainer_state.json").is_file():
                found[int(m.group(1))] = child
    return found


def latest_resume_point(run_dir: Path) -> Path | None:
    points = resume_points(run_dir)
    return points[max(points)] if points else None


def drop_older_resume_points(run_dir: Path, step: int) -> None:
    for s, path in resume_points(run_dir).items():
        if s < step:
            shutil.rmtree(path, ignore_errors=True)


def published_folder(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"global_step_{step}"


def published_steps(run_dir: Path, hf: Path | str = HF) -> list[int]:
    """The steps whose ``global_step_N`` folder holds its Hugging Face folder at ``hf`` (the local trainer's
    layout unless told; verl's is ``actor/huggingface``)."""
    folder = run_dir / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for c in folder.iterdir() if (m := _PUBLISHED.match(c.name)) and (c / hf).is_dir())


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def publish(run_dir: Path, point: Path, step: int) -> tuple[Path, int]:
    """Make ``checkpoints/global_step_<step>`` from a resume point; returns its Hugging Face folder and the bytes
    the checkpoint holds (each file once). Idempotent: a checkpoint already published is returned as it is."""
    final = published_folder(run_dir, step)
    if not (final / HF).is_dir():
        temp = final.with_name(final.name + ".tmp")
        shutil.rmtree(temp, ignore_errors=True)
        (temp / HF).mkdir(parents=True)
        (temp / "trainer").mkdir()
        for item in point.iterdir():
            if item.is_file():
                _link(item, temp / "trainer" / item.name)
                if HF_FILES.match(item.name):
                    _link(item, temp / HF / item.name)
        temp.rename(final)
    return final / HF, folder_bytes(final)


def folder_bytes(folder: Path) -> int:
    """The bytes under ``folder``, each file counted once however many links it has there."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            st = path.lstat()
            if path.is_file() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def hf_of(config: TrainConfig) -> Path | str:
    """Where a checkpoint of this run keeps its Hugging Face folder, under ``global_step_<N>``."""
    return VERL_HF if config.engine == "verl" else HF


def prune(run_dir: Path, keep: int | None, pinned: set[int], hf: Path | str = HF) -> list[int]:
    """Delete published checkpoints (their Hugging Face folder at ``hf``) beyond the newest ``keep``, except the
    ``pinned`` steps (an eval of them is still running). Returns the steps deleted."""
    if keep is None:
        return []
    steps = published_steps(run_dir, hf)
    doomed = [s for s in steps[: max(0, len(steps) - keep)] if s not in pinned]
    for step in doomed:
        shutil.rmtree(published_folder(run_dir, step), ignore_errors=True)
    return doomed
