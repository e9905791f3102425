"""Carrying a run to exactly one end: the runner's own validation, the engine, and the one mapping from however it
ended to its end event. The launcher (a run carried here or as a Ray job) and ``runctl run`` (in the foreground)
both use it, so a run ends the same way whichever carried it.

Every way out is an end payload: success, a cancel, a runctl error (with the phase it happened in, its type, its
message and the fix it names) and an unexpected error (a bug: its traceback goes to ``logs/runner.log`` in the run
folder, never to the user's terminal or the bus). Only the errors the caller names in ``reraise`` propagate (the
launcher hands a run on when the bus stays unreachable, rather than ending it).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from runctl.config import InferConfig, RunConfig
from runctl.errors import RunctlError
from runctl.events import RunCancelled, RunFailed, RunSucceeded
from runctl.layout import claim_folder, run_folder
from services.launcher.engines import RunContext, make_engine
from services.launcher.errors import EngineError, RunCancelledError

log = logging.getLogger(__name__)
EndPayload = RunSucceeded | RunFailed | RunCancelled


def run_dir_for(team: str, run_id: str, config: RunConfig) -> Path:
    """Where a run's artifacts go: ``OUTPUT_DIR``, else ``$RUNCTL_HOME/runs/<team>/<run_id>``."""
    return run_folder(team, run_id, config.output_dir)


async def carry_to_end(
    ctx: RunContext,
    cancelled_by: Callable[[], str],
    *,
    reraise: tuple[type[BaseException], ...] = (),
    attempts: int = 1,
) -> EndPayload:
    """Validate again, run the engine, and return the run's end payload, whatever happened.

    Args:
        ctx: the run.
        cancelled_by: who asked for the cancel, asked only when the run was cancelled.
        reraise: errors that must not end the run (they propagate).
        attempts: how many runners this run has had, this one included (for ``run.failed``).
    """
    try:
        await revalidate(ctx)
        claim_folders(ctx)
        outcome = await make_engine(ctx.config.engine).run(ctx)
    except reraise:
        raise
    except RunCancelledError:
        return RunCancelled(requested_by=cancelled_by(), phase=ctx.phase, num_trials=ctx.num_trials)
    except RunctlError as e:
        phase = e.phase if isinstance(e, EngineError) else ctx.phase
        return failed(phase, e, ctx.num_trials, attempts)
    except Exception as e:  # a bug in runctl: the run still ends, and the traceback is kept for the report
        where = record_crash(ctx, e)
        return RunFailed(
            phase=ctx.phase,
            error_type=type(e).__name__,
            message=f"an unexpected error in phase {ctx.phase}: {e}. This is a bug in runctl; the traceback is in "
            f"{where}. Fix: report it with that file; resume the run once it is fixed.",
            fix="report it with that file; resume the run once it is fixed.",
            num_trials=ctx.num_trials,
            attempts=attempts,
        )
    return RunSucceeded(
        summary=outcome.summary, score=outcome.score, synthetic=outcome.synthetic, num_trials=ctx.num_trials
    )


def claim_folders(ctx: RunContext) -> None:
    """Mark the run's folder (and an infer run's RESULTS_DIR) as this run's, refusing another run's.

    Raises:
        FolderTakenError: one of them is another run's.
    """
    claim_folder(ctx.run_dir, ctx.run_id, "OUTPUT_DIR")
    if isinstance(ctx.config, InferConfig) and ctx.config.results_dir:
        claim_folder(Path(ctx.config.results_dir), ctx.run_id, "RESULTS_DIR")


def failed(phase: str, error: RunctlError, num_trials: int = 0, attempts: int = 1) -> RunFailed:
    """The ``run.failed`` payload for a runctl error met in ``phase``."""
    return RunFailed(
        phase=phase,
        error_type=type(error).__name__,
        message=error.message,
        fix=error.fix,
        num_trials=num_trials,
        attempts=attempts,
    )


def record_crash(ctx: RunContext, error: BaseException) -> str:
    """Append the traceback of an unexpected error to the run's ``logs/runner.log``; return that path."""
    path = ctx.run_dir / "logs" / "runner.log"
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    text = "".join(traceback.format_exception(error))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(f"{stamp} unexpected error in phase {ctx.phase} of run {ctx.run_id}:\n{text}")
    except OSError:
        log.error("run %s: unexpected error in phase %s (cannot write %s):\n%s", ctx.run_id, ctx.phase, path, text)
    return str(path)


async def revalidate(ctx: RunContext) -> None:
    """The runner's own pass of the validator, just before launch: the static checks (files may have moved since
    the config was submitted) and the probes of this machine (the sandbox backend the run will use).

    Raises:
        EngineError: a check is fatal now (phase ``validate``).
    """
    import asyncio

    from services.validator.library import check_config  # the validator's public face

    await ctx.enter_phase("validate")
    results = await asyncio.to_thread(check_config, ctx.config, False, True)
    fatal = [r for r in results if r.severity == "fatal"]
    if fatal:
        detail = "; ".join(f"{r.id}: {r.message}" + (f" Fix: {r.fix}" if r.fix else "") for r in fatal)
        raise EngineError(f"{len(fatal)} check(s) fail just before launch: {detail}", phase="validate")
