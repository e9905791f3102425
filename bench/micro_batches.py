"""What TRAIN_MICRO_BSZ_PER_GPU buys a CPU train step on long sequences: peak memory and time of one update.

Runs one GRPO update of ENGINE=local's trainer (TRL's GRPOTrainer, as a train run drives it) on stand-in samples of
up to ``--tokens`` tokens (a prompt of three quarters of them, the rest the model's answer; every other prompt an
eighth shorter, so that the batch is padded as a step's is; ``--samples`` of them, one task's group): first the
whole batch in one pass, then in micro-batches of ``--micro``, each in a fresh process; prints each one's peak
resident memory and the update's wall time, with the ratios micro/whole. The model is the tiny model's scaffolds
shape (made when missing: 32,768 positions); such samples are what an agent with a long prompt gives the update
(OpenCode's and the OpenHands SDK's are about 20,000 tokens, Claude Code's 49,000).

Measured on 2 cores (peak GiB / update s, whole → micro-batches of 1): 4 × 8,192 tokens 2.80 / 32 → 1.34 / 27;
2 × 16,384 3.89 / 66 → 2.36 / 44; 2 × 32,768 11.7 / 269 → 6.5 / 177 (the padded batch's attention grows with the
square of its length).

    python bench/micro_batches.py [--samples 4] [--tokens 8192] [--micro 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one_update(model: Path, samples: int, tokens: int, micro: int) -> dict[str, float]:
    """In this process: one update on ``samples`` stand-in samples, in micro-batches of ``micro`` (0: one pass)."""
    from runctl.config import TrainConfig
    from runctl.config.loader import validate_settings
    from services.launcher.trainer.grpo import train
    from services.launcher.trainer.samples import Sample

    answer = tokens // 4
    values = {"RUN_TYPE": "train", "ENGINE": "local", "PROJECT_NAME": "bench", "EXP_NAME": "micro",
              "MODEL_PATH": str(model), "TRAIN_FILES": str(ROOT / "examples" / "tasks"), "NGPUS_PER_NODE": "0",
              "GEN_TP": "1", "TRAIN_BSZ": "1", "N_RESP": str(samples), "TOTAL_TRAINING_STEPS": "1",
              "MAX_PROMPT": str(tokens), "MAX_RESP": str(answer), "POLICY_LOSS_MODE": "vanilla"}  # fmt: skip
    if micro:
        values["TRAIN_MICRO_BSZ_PER_GPU"] = str(micro)
    config = validate_settings("train", values, "bench")
    assert isinstance(config, TrainConfig)
    took: dict[str, float] = {}

    class Hooks:
        def rollout(self, step: int, task_ids: list[str]) -> list[Sample]:
            took["began"] = time.monotonic()
            # Every other sample an eighth shorter: a step's sequences differ in length, so the batch is padded.
            prompts = [tokens - answer - (k % 2) * (tokens // 8) for k in range(len(task_ids))]
            ones = [1] * answer
            return [
                Sample(task, k, [5 + k % 7] * prompts[k], [9 + k % 3] * answer, [-0.7] * answer, ones, k % 2)
                for k, task in enumerate(task_ids)
            ]

        def after_step(self, step: int, point: Path, logs: dict[str, float], final: bool, updated_at: float) -> bool:
            took["update_s"] = updated_at - took["began"]
            return True

    with tempfile.TemporaryDirectory(prefix="bench-micro-") as out:
        train(config, ["a"], Path(out), Hooks(), None)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_gib": peak_kib / 2**20, "update_s": took["update_s"]}


def measured(model: Path, samples: int, tokens: int, micro: int) -> dict[str, float]:
    """:func:`one_update` in a fresh process, so that each peak is its own."""
    argv = [sys.executable, __file__, "--one", str(micro), "--samples", str(samples), "--tokens", str(tokens),
            "--model", str(model)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the update in micro-batches of {micro or samples} failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=4, help="samples in the step (one task's group; at least 2)")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens in each sample")
    parser.add_argument("--micro", type=int, default=1, help="TRAIN_MICRO_BSZ_PER_GPU to compare")
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "tinymodel-scaffolds")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_update(args.model, args.samples, args.tokens, args.one)))
        return 0
    if args.samples < 2 or args.samples % args.micro:
        raise SystemExit("--samples must be at least 2 and a multiple of --micro")
    subprocess.run([sys.executable, "-m", "runctl.tinymodel", "--shape", "scaffolds", str(args.model)], check=True)
    whole = measured(args.model, args.samples, args.tokens, 0)
    micro = measured(args.model, args.samples, args.tokens, args.micro)
    print(f"one update on {args.samples} samples of {args.tokens} tokens, the tiny model's scaffolds shape")
    print(f"{'':<22}{'peak GiB':>10}{'update s':>10}")
    print(f"{'whole batch':<22}{whole['peak_gib']:>10.2f}{whole['update_s']:>10.1f}")
    print(f"{f'micro-batches of {args.micro}':<22}{micro['peak_gib']:>10.2f}{micro['update_s']:>10.1f}")
    print(f"{'ratio micro/whole':<22}{micro['peak_gib'] / whole['peak_gib']:>10.2f}"
          f"{micro['update_s'] / whole['update_s']:>10.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
