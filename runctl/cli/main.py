"""The ``runctl`` command: the app of ``runctl.cli.app`` with every command group registered on it (one module per
group: runs, stack, task, proxy, team, tracker). Imports stay light so ``runctl --help`` answers at once; each command
imports what it needs. Errors: commands let a RunctlError propagate; ``main`` is the one place that catches it and
prints one red ``ErrorType: message`` line (a config error lists every problem), then exits 1. Usage errors exit 2.
"""

from __future__ import annotations

import contextlib
import os
import sys

# Each module registers its commands on the app when imported, in the order `runctl --help` lists them.
from runctl.cli import agents, bus, proxy, runs, stack, task, team, tracker  # noqa: F401
from runctl.cli.app import app, escape, new_console


def main() -> None:
    """Console entry point."""
    # Pydantic would scan every installed distribution's entry points for plugins (~80 ms a start with a full
    # environment); runctl uses none. Setting PYDANTIC_DISABLE_PLUGINS yourself (even empty) keeps your choice.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from runctl.errors import RunctlError

    try:
        app()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except RunctlError as e:
        report(e)
        code = 1
    except OSError as e:  # the machine's, not a bug: a folder not writable, a disk full; its message names the path
        report(e)
        code = 1
    except KeyboardInterrupt:
        new_console(stderr=True).print("interrupted")
        code = 130
    _exit_now(code)


def report(error: Exception) -> None:
    """The one way the CLI reports an error: a config error lists every problem; any other is one red line."""
    from runctl.errors import ConfigError, RunctlError

    console = new_console(stderr=True)
    if isinstance(error, ConfigError):
        from runctl.cli.render import print_config_error

        print_config_error(console, error)
        return
    message = error.message if isinstance(error, RunctlError) else str(error)
    console.print(f"[red]{type(error).__name__}[/]: {escape(message)}")


def _exit_now(code: int) -> None:
    """Exit as the interpreter would, less tearing down every module (~30 ms with pydantic loaded).

    Exit handlers run and the standard streams are flushed first, so nothing a command wrote or registered is lost.
    """
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
