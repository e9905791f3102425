"""``runctl task``: run one trial of a Harbor task, or check that a task is sound."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runctl.cli.app import app, escape, new_console, runctl_home

task_app = typer.Typer(help="Harbor-format tasks: run one trial, or check that a task is sound.", no_args_is_help=True)

app.add_typer(task_app, name="task")

TaskDirArg = Annotated[Path, typer.Argument(help="A Harbor task folder (task.toml, instruction.md, tests/test.sh).")]

BackendOpt = Annotated[str, typer.Option("--backend", help="Sandbox backend: docker or local (kubernetes: a cluster).")]

OutOpt = Annotated[Path | None, typer.Option("--out", help="Trial folder (default: under $RUNCTL_HOME/task-runs).")]


def _task_out(task_dir: Path, what: str, out: Path | None) -> Path:
    from datetime import UTC, datetime

    if out is not None:
        return out
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    return runctl_home() / "task-runs" / f"{task_dir.resolve().name}-{what}-{stamp}"


@task_app.command("run")
def task_run(
    task_dir: TaskDirArg,
    agent: Annotated[str, typer.Option("--agent", help="Built-in agent: oracle (runs solution/solve.sh) or nop.")],
    backend: BackendOpt = "docker",
    json_out: Annotated[bool, typer.Option("--json", help="Print the trial result as JSON.")] = False,
    out: OutOpt = None,
) -> None:
    """Run one trial of a task: sandbox, agent, verifier. Prints the reward, how the trial ended, and timings."""
    from services.sandbox.library import run_task

    folder = _task_out(task_dir, agent, out)
    result = run_task(task_dir, agent, backend, folder)  # type: ignore[arg-type]
    if json_out:
        print(result.model_dump_json(indent=2))
        return
    reward = "none (verifier error)" if result.reward is None else f"{result.reward:g}"
    console = new_console()
    console.print(f"[bold]{result.task_id}[/] agent={result.agent} backend={result.backend}: reward {reward}")
    console.print(f"  ended: {result.termination_reason}")
    if result.failure is not None:
        console.print(f"  [yellow]{result.failure.cause}[/]: {escape(result.failure.message)}")
    console.print("  " + ", ".join(f"{k} {v:.2f} s" for k, v in result.timings_s.items()))
    console.print(f"  trial folder: {folder}")


@task_app.command("check")
def task_check(task_dir: TaskDirArg, backend: BackendOpt = "docker", out: OutOpt = None) -> None:
    """Check a task is sound: the oracle must score 1 and nop 0. Exit 1 when it is not."""
    from services.sandbox.library import check_task

    folder = _task_out(task_dir, "check", out)
    verdict = check_task(task_dir, backend, folder)  # type: ignore[arg-type]
    console = new_console()
    for result in (verdict.oracle, verdict.nop):
        console.print(f"  {result.agent}: reward {result.reward} ({result.termination_reason})")
    if verdict.sound:
        console.print(f"[green]sound[/]: {verdict.oracle.task_id} (trials under {folder})")
        return
    console.print(f"[red]not sound[/]: {'; '.join(verdict.problems())} (trials under {folder})")
    raise typer.Exit(1)
