"""Carry each bundled scaffold through an infer, a train and an eval run on this machine, and print what each did.

For every scaffold (``mswea``, ``oc``, ``ohsdk``, ``cc``; build their bundles first: ``runctl agents build mswea oc
ohsdk cc``) it runs, with ``runctl run`` on the local backend (bubblewrap, the network off in every sandbox):

- an infer run of ``examples/tasks`` (``--trials`` trials a task),
- a train run on ``examples/tasks/write-done`` (``--steps`` GRPO steps of two trials, a checkpoint at the end),
- an eval run of that checkpoint on ``examples/tasks-heldout`` (``--trials`` trials a task),

and prints per run how its trials ended, how many passed, the tokens the model generated and the wall time.
mini-swe-agent, OpenCode and the OpenHands SDK run on the tiny model's scaffolds shape (``.cache/tinymodel-scaffolds``:
32,768 positions, taught under mini-swe-agent and OpenCode), served with the context each needs; Claude Code's first
prompt (49,000 tokens) does not fit it, so cc runs on a copy whose configuration claims 65,536 positions (those past
32,768 untaught): its calls are real and its trials end cleanly, solving nothing. The train runs of the tool
scaffolds update on sequences of their prompts' length (OpenCode's and the SDK's 19,000 and 21,000 tokens, Claude
Code's 49,000), in micro-batches of one sample (TRAIN_MICRO_BSZ_PER_GPU=1): in one pass Claude Code's two took more
than the 22 GiB this machine could give the update; in two, its train run took 7 minutes an update and at most 16 GiB
of the machine's memory in all (18 minutes for two steps).

    python scripts/scaffold_runs.py [--scaffolds mswea oc ohsdk cc] [--train mswea oc ohsdk cc] [--trials 2] [--steps 2]

The configs are the shipped examples (``infer-mswea.env``, ``train-mswea.env``, ``eval-cpu.env``) with the values
above set. As root, the script re-executes itself in a network namespace of its own with only loopback up (Ray binds
the machine's address whatever it is told). About 40 minutes for all four on two cores.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from runs import ROOT, example_config, reexec_in_loopback_netns  # noqa: E402

from runctl import tinymodel  # noqa: E402

SCAFFOLDS = ("mswea", "oc", "ohsdk", "cc")
#: The serving length each scaffold needs (its prompt as its bundle's build recorded it, with room to answer).
CONTEXT = {"mswea": 4096, "oc": tinymodel.SCAFFOLD_CONTEXT, "ohsdk": tinymodel.SCAFFOLD_CONTEXT, "cc": 65536}
LONG_POSITIONS = max(CONTEXT.values())
SANDBOX_MEMORY_MB = 1024  # OpenCode alone needs about 520 MiB
#: Two model calls are enough to end a trial (a cold prefill of Claude Code's prompt takes 70 s on two cores); OpenCode
#: takes its tools away at its last step, so the model taught under it (a call, then an answer) is given four.
TURNS = {"oc": 4}
AGENT_TURNS, AGENT_TIMEOUT_SEC = 2, 400


def long_copy(model: Path, folder: Path) -> Path:
    """The scaffolds shape, its configuration claiming LONG_POSITIONS positions (Claude Code's prompt needs them)."""
    out = folder / "long-model"
    shutil.copytree(model, out)
    config = json.loads((out / "config.json").read_text())
    config["max_position_embeddings"] = LONG_POSITIONS
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def write_config(folder: Path, example: str, name: str, values: dict[str, object]) -> Path:
    """The shipped example ``example`` with ``values`` set (``SCAFFOLD`` among them), as run ``name`` (its EXP_NAME) in
    ``folder/name``, with the scaffold's turn budget."""
    out = folder / name
    out.mkdir()
    turns = TURNS.get(str(values["SCAFFOLD"]), AGENT_TURNS)
    budget = {"AGENT_MAX_ITERATIONS": turns, "AGENT_TIMEOUT_SEC": AGENT_TIMEOUT_SEC}
    values = {"EXP_NAME": name, "SANDBOX_MEMORY_MB": SANDBOX_MEMORY_MB, **budget, **values}
    return example_config(example, out, {k: str(v) for k, v in values.items()})


def run(config: Path, home: Path) -> tuple[Path, float]:
    """``runctl run`` on one config; the run's folder and its wall time."""
    argv = [str(Path(sys.executable).parent / "runctl"), "run", str(config)]
    began = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "RUNCTL_HOME": str(home)}, capture_output=True, text=True)
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"{config} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    (folder,) = (home / "runs" / "demo").glob(f"{config.parent.name}-*")
    return folder, wall


def row(scaffold: str, kind: str, folder: Path, wall: float) -> str:
    records = [json.loads(p.read_text()) for p in folder.glob("trials/*/trial-*/trial.json")]
    endings = collections.Counter(r["termination_reason"] for r in records)
    passes = sum(1 for r in records if r["reward"] == 1)
    generated = sum(int(r["tokens"].get("completion", 0)) for r in records)
    ended = ", ".join(f"{k} {v}" for k, v in sorted(endings.items()))
    return f"{scaffold:<6} {kind:<6} {len(records):>6} {passes:>6} {generated:>9} {wall:>7.0f}  {ended}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scaffolds", nargs="+", choices=SCAFFOLDS, default=list(SCAFFOLDS))
    parser.add_argument("--train", nargs="*", choices=SCAFFOLDS, default=list(SCAFFOLDS))
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "tinymodel-scaffolds")
    parser.add_argument("--keep", type=Path, help="copy the runs' folders (trials, captures, logs) here at the end")
    args = parser.parse_args()
    reexec_in_loopback_netns()
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"no model at {args.model}: make it with python -m runctl.tinymodel --shape scaffolds DIR")
    rows = []
    with tempfile.TemporaryDirectory(prefix="scaffold-runs-") as tmp:
        root = Path(tmp)
        long_model = long_copy(args.model.resolve(), root)
        for scaffold in args.scaffolds:
            model = long_model if CONTEXT[scaffold] > tinymodel.SCAFFOLD_CONTEXT else args.model.resolve()
            common = {"MODEL_PATH": model, "MAX_MODEL_LEN": CONTEXT[scaffold], "SCAFFOLD": scaffold}
            infer = write_config(root, "infer-mswea.env", f"infer-{scaffold}", {
                **common, "N_TRIALS": args.trials, "N_CONCURRENT": 2, "TRIAL_HARD_TIMEOUT_SEC": 600,
            })  # fmt: skip
            folder, wall = run(infer, root / "home")
            rows.append(row(scaffold, "infer", folder, wall))
            evaluated = model
            if scaffold in args.train:
                train = write_config(root, "train-mswea.env", f"train-{scaffold}", {
                    **common, "TRAIN_FILES": ROOT / "examples" / "tasks" / "write-done", "N_RESP": 2,
                    "AGENT_NUM_WORKERS": 2, "MAX_PROMPT": CONTEXT[scaffold] - 1024, "MAX_RESP": 1024,
                    "TOTAL_TRAINING_STEPS": args.steps, "SAVE_FREQ": args.steps, "LR_WARMUP_STEPS": 0,
                    "EVAL_ON_CHECKPOINT": 0, "TRAIN_MICRO_BSZ_PER_GPU": 1,
                })  # fmt: skip
                folder, wall = run(train, root / "home")
                rows.append(row(scaffold, "train", folder, wall))
                evaluated = Path(json.loads((folder / "summary.json").read_text())["last_checkpoint"])
            else:
                rows.append(f"{scaffold:<6} train  (not run: see --train)")
            evaluate = write_config(root, "eval-cpu.env", f"eval-{scaffold}", {
                **common, "MODEL_PATH": evaluated, "N_TRIALS": args.trials, "N_CONCURRENT": 2,
            })  # fmt: skip
            folder, wall = run(evaluate, root / "home")
            rows.append(row(scaffold, "eval", folder, wall))
            print(*rows[-3:], sep="\n", flush=True)
        if args.keep is not None:
            shutil.copytree(root / "home" / "runs", args.keep, dirs_exist_ok=True)
    print("== scaffolds through infer, train and eval runs (local backend, network off, this machine)")
    print(f"{'agent':<6} {'run':<6} {'trials':>6} {'passes':>6} {'generated':>9} {'wall s':>7}  endings")
    print(*rows, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
