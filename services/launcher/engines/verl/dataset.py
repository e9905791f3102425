"""The run's tasks as verl's dataset: one parquet row per task, in the columns verl's ``RLHFDataset`` reads.

verl's trainer draws its batches from a parquet file of prompts. runctl's rows carry the task's instruction as the
chat ``prompt`` (verl measures it against ``data.max_prompt_length`` and passes it on as ``raw_prompt``), the agent
loop to run (``agent_name: runctl``), and in ``extra_info`` what the loop needs to run a trial of the task: its id and
folder. verl shuffles and batches the rows; the agent loop reads ``extra_info`` and runs the trial.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from runctl.tasks import Task

AGENT_NAME = "runctl"
DATA_SOURCE = "runctl"


def rows(tasks: list[Task]) -> list[dict[str, object]]:
    """verl's rows for these tasks, in their order."""
    return [
        {
            "data_source": DATA_SOURCE,
            "agent_name": AGENT_NAME,
            "prompt": [{"role": "user", "content": task.instruction}],
            "reward_model": {"style": "runctl-verifier", "ground_truth": ""},
            "extra_info": {"index": i, "task_id": task.id, "task_path": str(task.path.resolve())},
        }
        for i, task in enumerate(tasks)
    ]


def write(tasks: list[Task], path: Path) -> Path:
    """Write the rows to ``path`` (parquet), atomically; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows(tasks)), temp)
    temp.replace(path)
    return path
