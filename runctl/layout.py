"""Where a run's artifacts live: the one layout the runner writes and the tracker reads.

```
<run folder>                 OUTPUT_DIR, else $RUNCTL_HOME/runs/<team>/<run_id>
├── config.json  events.jsonl  progress.json  summary.csv  summary.json  logs/
└── trials/<task>/trial-<k>/ trial.json  trajectory.json  agent/  logs/verifier/  (RESULTS_DIR replaces trials/)
```
"""

from __future__ import annotations

import re
from pathlib import Path

from runctl.home import home

TRIAL_RECORD = "trial.json"
PASS_THRESHOLD = 1.0
"""A trial passes when its reward is at least this: the runner's scores and the tracker's pass rates agree."""
TRAJECTORY = "trajectory.json"


def run_folder(team: str, run_id: str, output_dir: str | None = None) -> Path:
    """A run's folder: ``OUTPUT_DIR`` when the config sets one, else ``$RUNCTL_HOME/runs/<team>/<run_id>``."""
    if output_dir:
        return Path(output_dir)
    return home() / "runs" / team / run_id


def trials_folder(run_dir: Path, results_dir: str | None = None) -> Path:
    """The folder of a run's trial folders: an infer run's ``RESULTS_DIR`` when set, else ``<run>/trials``."""
    return Path(results_dir) if results_dir else run_dir / "trials"


def trial_folder(trials_dir: Path, task_id: str, trial: int) -> Path:
    """One trial's folder; a task id is made safe for a file name."""
    return trials_dir / re.sub(r"[^A-Za-z0-9_.-]", "_", task_id) / f"trial-{trial}"
