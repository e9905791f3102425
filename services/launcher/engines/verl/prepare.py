"""What the runner leaves in the run folder before it starts verl: the files runctl's overrides point verl at.

    verl/train.parquet, verl/val.parquet   the tasks as verl's dataset rows (``dataset.py``)
    verl/agent_loops.yaml                  verl's agent-loop registry: runctl's loop, told the run folder
    verl/runctl_config.json                the run's config, for the agent loops in verl's workers (``host.py``)

verl writes back into the same folder: ``verl/steps.jsonl`` (its file logger), ``checkpoints/global_step_N/``,
``verl/outbox/`` (runctl's plugins), and ``trials/`` (the agent loops).
"""

from __future__ import annotations

from pathlib import Path

from runctl import verl as verl_contract
from runctl.config import TrainConfig
from runctl.tasks import Task
from services.launcher.engines.verl import dataset
from services.launcher.engines.verl.host import write_config


def prepare(config: TrainConfig, run_dir: Path, train: list[Task], val: list[Task], run_id: str | None = None) -> None:
    """Write the files runctl's overrides name (``runctl.verl.verl_overrides``), and the run's id for the workers
    (``run_id``; the run folder's name when not given)."""
    dataset.write(train, run_dir / verl_contract.TRAIN_FILE)
    dataset.write(val or train, run_dir / verl_contract.VAL_FILE)
    registry = run_dir / verl_contract.AGENT_LOOPS_FILE
    registry.write_text(verl_contract.agent_loops_yaml(str(run_dir.resolve())))
    write_config(verl_contract.with_absolute_paths(config), run_dir, run_id or run_dir.name)
    (run_dir / verl_contract.STEP_LOG).parent.mkdir(parents=True, exist_ok=True)
