"""How long a second ``./scripts/demo.sh`` takes to reach its first phase, against ``runctl run`` alone.

On a machine where the demo has run once (Debian packages, ``.venv``, the tiny model and the stack are there), the
demo must do none of that again: its setup (the package check, ``scripts/setup.sh``, the model check, ``runctl up``)
and its submission must cost little beside the run's own start. This script starts ``./scripts/demo.sh`` and
times the first ``phase.started`` line it prints, then stops it and cancels the runs it submitted; then does
the same for ``runctl run configs/examples/infer-cpu.env`` alone, the baseline. Target: the demo's first phase
within 10 s.

    python bench/setup.py [--repeat 2]

It uses ``$RUNCTL_HOME`` (default ``~/.runctl``) as the demo does, and leaves its stack up as the demo does.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 10.0


def _as_from_a_terminal() -> None:
    """In the child, before exec: SIGINT does what Ctrl-C in a terminal does. A process started in the background by
    a shell without job control (a CI script, ``nohup … &``) inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt for it: the interrupt below would be lost and the demo would go on to its train run."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def first_phase(argv: list[str], env: dict[str, str], timeout_s: float = 600) -> float:
    """Seconds from starting ``argv`` until it prints a ``phase.started`` line; then it is interrupted and reaped."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_as_from_a_terminal,
    )
    assert proc.stdout is not None
    seen = None
    submitted: list[str] = []
    try:
        for line in proc.stdout:
            if line.startswith("submitted "):
                submitted.append(line.split()[1])
            if "phase.started" in line:
                seen = time.monotonic() - started
                break
            if time.monotonic() - started > timeout_s:
                break
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # a foreground run cancels itself cleanly; its Ray and vLLM go with it
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        runctl = str(ROOT / ".venv" / "bin" / "runctl")
        for run_id in submitted:  # the demo's runs are the stack's: ask the launcher to stop them, and wait until
            # they have ended (`runctl watch` returns at the end event), or the next demo's is refused as a duplicate
            subprocess.run([runctl, "cancel", run_id], cwd=ROOT, env=env, check=False, capture_output=True)
            subprocess.run([runctl, "watch", run_id], cwd=ROOT, env=env, check=False, capture_output=True, timeout=300)
    if seen is None:
        raise SystemExit(f"{' '.join(argv)} printed no phase.started within {timeout_s:.0f} s (exit {proc.returncode})")
    return seen


def run_alone_argv() -> list[str]:
    runctl = [str(ROOT / ".venv" / "bin" / "runctl"), "run", "configs/examples/infer-cpu.env"]
    if os.geteuid() == 0 and not os.environ.get("RUNCTL_LOOPBACK_NETNS"):
        # As the demo runs it: Ray only inside a loopback-only namespace.
        return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *runctl]
    return runctl


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2, help="timed starts of each")
    args = parser.parse_args()
    env = dict(os.environ)
    first_phase(["./scripts/demo.sh"], env)  # warm: whatever the demo sets up once is there after this
    demo = [first_phase(["./scripts/demo.sh"], env) for _ in range(args.repeat)]
    alone = [first_phase(run_alone_argv(), env) for _ in range(args.repeat)]
    demo_s, alone_s = statistics.median(demo), statistics.median(alone)
    print(f"demo.sh to its first phase: {', '.join(f'{s:.2f}' for s in demo)} s")
    print(f"runctl run alone to its first phase: {', '.join(f'{s:.2f}' for s in alone)} s")
    print("== summary")
    print(f"demo_first_phase_s {demo_s:.2f}  (target <= {TARGET_S:.0f} s: {'met' if demo_s <= TARGET_S else 'MISSED'})")
    print(f"run_first_phase_s {alone_s:.2f}")
    print(f"setup_ratio {demo_s / alone_s:.2f}  (the demo's setup on top of the run's own start)")
    return 0 if demo_s <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
