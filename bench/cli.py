"""How fast the CLI answers: ``runctl --help`` and ``runctl validate`` as whole processes, cold.

Run as ``python bench/cli.py`` with the project's virtualenv active. Each command runs ``--repeat`` times
(alternating, so drift hits all alike); the baseline is a bare ``python -c pass`` of the same interpreter, measured
in the same run, so the figures say what runctl itself adds. Target on the CI machine: ``runctl --help`` under
0.5 s (median).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNCTL = str(Path(sys.executable).parent / "runctl")
HELP_TARGET_S = 0.5


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    commands = {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        "runctl --help": [RUNCTL, "--help"],
        "runctl validate preview.env": [RUNCTL, "validate", "configs/examples/preview.env"],
    }
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeat):
        for name, argv in commands.items():
            samples[name].append(timed(argv))
    baseline = statistics.median(samples["python -c pass (baseline)"])
    print(f"== CLI start-up, {args.repeat} runs each, median (p90)")
    for name, values in samples.items():
        median = statistics.median(values)
        p90 = sorted(values)[int(0.9 * (len(values) - 1))]
        print(f"   {name:<30} {median * 1000:7.1f} ms ({p90 * 1000:.1f} ms)   {median / baseline:5.1f} × baseline")
    help_s = statistics.median(samples["runctl --help"])
    verdict = "MET" if help_s < HELP_TARGET_S else "NOT MET"
    print(f"== summary\n   runctl --help {help_s * 1000:.0f} ms   target < {HELP_TARGET_S * 1000:.0f} ms   {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
