"""Where a run's artifacts live: the one layout the runner writes and the tracker reads.

```
<run folder>                 OUTPUT_DIR, else $RUNCTL_HOME/runs/<team>/<run_id>
├── config.json  events.jsonl  progress.json  summary.csv  summary.json  logs/
└── trials/<task>/trial-<k>/ trial.json  trajectory.json  agent/  logs/verifier/  (RESULTS_DIR replaces trials/)
```
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from runctl.errors import RunctlError
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


OWNER_MARK = ".runctl-run"
"""In a run's folder (and an infer run's RESULTS_DIR): the id of the run that writes there."""


class FolderTakenError(RunctlError):
    """A run was pointed at a folder another run writes to."""


def claim_folder(folder: Path, run_id: str, key: str) -> None:
    """Mark ``folder`` as ``run_id``'s, or refuse it when another run's mark is there: a run never adopts, resumes
    from or deletes another run's trial folders.

    Raises:
        FolderTakenError: the folder is another run's.
    """
    mark = folder / OWNER_MARK
    try:
        owner = mark.read_text().strip()
    except FileNotFoundError:
        folder.mkdir(parents=True, exist_ok=True)
        mark.write_text(run_id + "\n")
        return
    if owner != run_id:
        raise FolderTakenError(
            f"{key}={folder} is run {owner}'s folder; this run ({run_id}) would adopt or delete its trials. "
            f"Fix: give this run a {key} of its own (or leave it unset).",
            run_id=run_id,
        )


def team_areas(team: str, environ: Mapping[str, str] | None = None) -> list[Path] | None:
    """The folders a team's runs may write under on this cluster: the templates of ``RUNCTL_TEAM_PATHS``
    (``/data/{team},/scratch/{team}``) and the team's default run folder root; None when the site confines no team
    (the variable unset: a single-user stack)."""
    env = os.environ if environ is None else environ
    templates = [t.strip() for t in env.get("RUNCTL_TEAM_PATHS", "").split(",") if t.strip()]
    if not templates:
        return None
    return [Path(os.path.realpath(t.replace("{team}", team))) for t in templates] + [
        Path(os.path.realpath(home() / "runs" / team))
    ]


def outside_team_areas(
    team: str, written: Mapping[str, str | None], environ: Mapping[str, str] | None = None
) -> list[str]:
    """``KEY=path`` of each folder or file the run would write (``written``: key → path) that is not under one of
    the team's areas, symbolic links followed; [] when all are, or when the site confines no team."""
    areas = team_areas(team, environ)
    if areas is None:
        return []
    outside = []
    for key, value in written.items():
        if not value:
            continue
        path = Path(value)
        real = Path(os.path.realpath(path)) if path.is_absolute() else None
        if real is None or not any(real == area or area in real.parents for area in areas):
            outside.append(f"{key}={value}")
    return outside
