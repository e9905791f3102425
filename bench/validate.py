"""How fast validation is: ``runctl validate --static`` as a whole process (cold: a new process each time), and
the library call alone (resolve the config, run every static check) in a warm process.

Run as ``python bench/validate.py`` with the project's virtualenv active. The baseline is a bare ``python -c pass``
of the same interpreter in the same run. Target on the CI machine: the whole process ≤ 0.3 s median.
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
CONFIG = ROOT / "configs" / "examples" / "preview.env"
PROCESS_TARGET_S = 0.3


def wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def library_call_s(repeat: int) -> list[float]:
    from runctl.config import load_config
    from services.validator.library import check_config

    check_config(load_config(CONFIG).model)  # warm: imports and schema builds are paid once
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        check_config(load_config(CONFIG).model)
        samples.append(time.perf_counter() - started)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    baseline, process = [], []
    for _ in range(args.repeat):
        baseline.append(wall([sys.executable, "-c", "pass"]))
        process.append(wall([RUNCTL, "validate", "--static", str(CONFIG)]))
    library = library_call_s(args.repeat * 10)
    base_s, process_s, library_s = (statistics.median(x) for x in (baseline, process, library))
    print(f"== validate {CONFIG.relative_to(ROOT)}, medians")
    print(f"   python -c pass (baseline)             {base_s * 1000:8.1f} ms")
    print(f"   runctl validate --static (process)   {process_s * 1000:8.1f} ms   {process_s / base_s:5.1f} × baseline")
    print(f"   library call (resolve + checks)      {library_s * 1000:8.2f} ms")
    verdict = "MET" if process_s <= PROCESS_TARGET_S else "NOT MET"
    target_ms = PROCESS_TARGET_S * 1000
    print(f"== summary\n   whole process {process_s * 1000:.0f} ms   target <= {target_ms:.0f} ms   {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
