"""``runctl agents``: the agent scaffolds' bundles a sandbox mounts (``runctl.bundles``)."""

from __future__ import annotations

from typing import Annotated

import typer

from runctl.cli.app import app, new_console

agents_app = typer.Typer(
    help="Agent scaffolds' bundles: each agent's runtime and the agent, pinned, built once for offline sandboxes.",
    no_args_is_help=True,
)

app.add_typer(agents_app, name="agents")


@agents_app.command("build")
def agents_build(
    names: Annotated[
        list[str],
        typer.Argument(help="The scaffolds whose agents to bundle (mswea, cc, oc, ohsdk).", show_default=False),
    ],
    version: Annotated[
        str | None, typer.Option(help="The agent's version (its package's; one agent only); not given: the default.")
    ] = None,
    force: Annotated[bool, typer.Option(help="Build again even if the bundle exists.")] = False,
) -> None:
    """Build agents' bundles from the package indexes pip and npm are configured with (several at once, side by side);
    trials then need no network."""
    from runctl import bundles

    bundles.build_many(names, version, force=force, say=new_console().print)


@agents_app.command("list")
def agents_list() -> None:
    """The bundles built on this machine, and the agents that have none yet."""
    from rich.table import Table

    from runctl import bundles

    built = bundles.all_built()
    table = Table(box=None, pad_edge=False)
    for column in ("agent", "version", "runtime", "sha256", "folder"):
        table.add_column(column)
    for bundle in built:
        table.add_row(
            bundle.name, bundle.version, str(bundle.manifest["runtime"]), bundle.sha256[:16], str(bundle.path)
        )
    missing = sorted(set(bundles.SPECS) - {b.name for b in built})
    console = new_console()
    if built:
        console.print(table)
    for name in missing:
        console.print(f"{name}: not built (`runctl agents build {name}`)")
