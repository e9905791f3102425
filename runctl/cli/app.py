"""What every command group of the ``runctl`` command shares: the Typer app they register on, and the helpers they
(and the demo and the GPU smoke) call: a console, running a coroutine, the client, the home, loading a config and
running and printing its checks. Imports stay light here: each helper imports what it needs when called.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from runctl.config.loader import ResolvedConfig
    from runctl.sdk import RunctlClient

app = typer.Typer(
    name="runctl",
    help="Control plane for agentic RL runs: validate, submit, watch and cancel train, eval and infer runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

T = TypeVar("T")

ConfigArg = Annotated[Path, typer.Argument(help="The run's .env config.", show_default=False)]

RunArg = Annotated[str, typer.Argument(help="Run id, as printed by `runctl submit` or `runctl runs`.")]


def new_console(stderr: bool = False) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


def run_sync(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end (errors reach ``main``, the one place that reports them)."""
    import asyncio  # here, not at the top: it costs a tenth of a second that `--help` need not pay

    return asyncio.run(coro_fn())


def escape(text: str) -> str:
    return text.replace("[", "\\[")


def new_client() -> RunctlClient:
    from runctl.sdk import RunctlClient

    return RunctlClient()


def runctl_home() -> Path:
    from runctl.home import home

    return home()


def load(config: Path) -> ResolvedConfig:
    from runctl.config.loader import load_config

    return load_config(config)


def checks(resolved: ResolvedConfig, live: bool, host: bool = False) -> list[Any]:
    """Every check of a resolved config (the validator's public face): live probes, and probes of this machine."""
    from services.validator.library import check_resolved

    return check_resolved(resolved, live, host)


def print_checks(results: list[Any]) -> int:
    """One line per check and a summary; returns the number of fatal results."""
    from runctl.cli.checklines import colours_on, render

    text, fatal = render(results, colours_on(sys.stdout))
    sys.stdout.write(text)
    return fatal


def refuse_fatal(results: list[Any], what: str) -> None:
    """Print the checks and raise when any is fatal.

    Raises:
        ChecksFailedError: naming the fatal checks.
    """
    from runctl.errors import ChecksFailedError

    fatal = [(r.id, r.message, r.fix) for r in results if r.severity == "fatal"]
    if fatal:
        print_checks(results)
        raise ChecksFailedError(fatal, what)
