"""``runctl team``: the teams of a shared cluster, their quotas, weights and tokens (an admin's commands)."""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from runctl.cli.app import app, new_client, new_console, run_sync

T = TypeVar("T")


team_app = typer.Typer(
    help="Teams of a shared cluster (admin): quotas, fair-share weight and the token each team connects with.",
    no_args_is_help=True,
)

app.add_typer(team_app, name="team")

_NO_QUOTA = " Not given: no quota of its own (the cluster's size bounds it); inf removes one."

GpusOpt = Annotated[float | None, typer.Option(help="GPUs the team may hold at once." + _NO_QUOTA)]

CpusOpt = Annotated[float | None, typer.Option(help="CPUs the team's CPU runs may hold at once." + _NO_QUOTA)]

SandboxesOpt = Annotated[float | None, typer.Option(help="Sandboxes the team may hold at once." + _NO_QUOTA)]

WeightOpt = Annotated[float, typer.Option(help="The team's fair share of the cluster against the others'.")]

EventsOpt = Annotated[
    int | None,
    typer.Option(
        "--events-mb",
        help="MiB of run events the bus keeps for the team (its RUNS stream and its view); once full, its new run "
        "events are refused, none recorded is dropped. Not given: 256.",
    ),
]

TrialsOpt = Annotated[
    int | None,
    typer.Option(
        "--trials-mb", help="MiB of trial events the bus keeps for the team, a ring (the oldest go). Not given: 1024."
    ),
]

ConsumersOpt = Annotated[
    int | None,
    typer.Option(
        "--consumers",
        help="Consumers the team's account may hold on the bus at once (each watch of a run holds one while it "
        "lasts); one more is refused. Not given: 64.",
    ),
]

TeamArg = Annotated[str, typer.Argument(help="The team's name.", show_default=False)]


async def _registry_call(work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
    """``work`` on the team registry; on the embedded stack, returns once its bus has taken the change."""
    from runctl.stackbus import wait_applied
    from runctl.teams import TeamRegistry

    async with new_client() as client:
        bus = await client.bus()
        registry = TeamRegistry(bus)
        result = await work(registry)
        await wait_applied(bus.url, await registry.sequence())
        return result


def _print_token(name: str, token: str, what: str) -> None:
    console = new_console()
    console.print(f"[green]{what}[/] team {name}. Its token, shown this once (keep it secret; rotate it if it leaks):")
    console.print(f"  RUNCTL_TOKEN={token}")
    console.print(f"  bus credentials: user {name}, password the token (its own account on the bus)")


@team_app.command("add")
def team_add(
    name: TeamArg,
    gpus: GpusOpt = None,
    cpus: CpusOpt = None,
    sandboxes: SandboxesOpt = None,
    weight: WeightOpt = 1.0,
    events_mb: EventsOpt = None,
    trials_mb: TrialsOpt = None,
    consumers: ConsumersOpt = None,
) -> None:
    """Add a team with its quotas, weight and storage on the bus; prints its token once."""
    team, token = run_sync(
        lambda: _registry_call(lambda r: r.add(name, gpus, cpus, sandboxes, weight, events_mb, trials_mb, consumers))
    )
    _print_token(team.name, token, "added")


@team_app.command("list")
def team_list() -> None:
    """Every team with its quotas, weight and storage on the bus (never a token); '-' is no quota."""
    from rich.table import Table

    from runctl.teams import MIB, quota_text

    teams = run_sync(lambda: _registry_call(lambda r: r.all()))
    table = Table(box=None, pad_edge=False)
    for column in ("team", "gpus", "cpus", "sandboxes", "weight", "events MiB", "trials MiB", "consumers"):
        table.add_column(column)
    for team in teams:
        limits = team.stream_limits()
        table.add_row(
            team.name,
            *map(quota_text, (team.gpus, team.cpus, team.sandboxes)),
            f"{team.weight:g}",
            str(limits.runs_max_bytes // MIB),
            str(limits.trials_max_bytes // MIB),
            str(team.nats_user().limits.consumers),
        )
    new_console().print(table if teams else "no teams yet: `runctl team add NAME` adds one")


@team_app.command("set")
def team_set(
    name: TeamArg,
    gpus: GpusOpt = None,
    cpus: CpusOpt = None,
    sandboxes: SandboxesOpt = None,
    weight: Annotated[float | None, typer.Option(help="The team's fair share against the others'.")] = None,
    events_mb: EventsOpt = None,
    trials_mb: TrialsOpt = None,
    consumers: ConsumersOpt = None,
) -> None:
    """Change a team's quotas, weight, storage or consumers on the bus (its streams take a new bound at once, its
    account once the bus's configuration is applied: at once on the embedded stack)."""
    from runctl.teams import MIB, quota_text

    given = {"gpus": gpus, "cpus": cpus, "sandboxes": sandboxes, "weight": weight}
    bus = {"events_mb": events_mb, "trials_mb": trials_mb, "consumers": consumers}
    changes = {k: float(v) for k, v in (given | bus).items() if v is not None}
    if not changes:
        raise typer.BadParameter(
            "give at least one of --gpus, --cpus, --sandboxes, --weight, --events-mb, --trials-mb, --consumers"
        )
    team = run_sync(lambda: _registry_call(lambda r: r.update(name, **changes)))
    quotas = ", ".join(f"{k} {quota_text(getattr(team, k))}" for k in ("gpus", "cpus", "sandboxes"))
    limits = team.stream_limits()
    storage = f"events {limits.runs_max_bytes // MIB} MiB, trials {limits.trials_max_bytes // MIB} MiB"
    storage += f", consumers {team.nats_user().limits.consumers}"
    new_console().print(f"team {team.name}: {quotas}, weight {team.weight:g}, {storage}")


@team_app.command("rotate")
def team_rotate(name: TeamArg) -> None:
    """Give a team a new token; the old one stops working. Prints the new token once."""
    team, token = run_sync(lambda: _registry_call(lambda r: r.rotate(name)))
    _print_token(team.name, token, "rotated the token of")


@team_app.command("remove")
def team_remove(name: TeamArg) -> None:
    """Remove a team: its token stops working. Its runs and their records stay."""
    run_sync(lambda: _registry_call(lambda r: r.remove(name)))
    new_console().print(f"removed team {name}")


@team_app.command("nats-config")
def team_nats_config(
    out: Annotated[Path, typer.Option(help="Where to write nats-server's configuration (mode 0600).")],
    listen: Annotated[str, typer.Option(help="host:port nats-server listens on.")] = "127.0.0.1:4222",
    store: Annotated[Path, typer.Option(help="Where JetStream keeps its streams.")] = Path("/var/lib/runctl/jetstream"),
    bootstrap: Annotated[
        bool, typer.Option(help="The services and the admin only, without the registry: the first start of the bus.")
    ] = False,
    issuer_seed: Annotated[
        Path | None,
        typer.Option(
            help="Take run logins from the launcher's auth callout, signed by the account key in this file (made, "
            "mode 0600, when missing; give the launcher the same file as RUNCTL_RUN_LOGIN_SEED_FILE)."
        ),
    ] = None,
) -> None:
    """Write nats-server's configuration from the team registry: the services' account with its user (password from
    $RUNCTL_SERVICES_PASSWORD) and the admin (from $RUNCTL_ADMIN_PASSWORD), and one account per team with its user.
    Reload nats-server twice after (SIGHUP): a removed team or a rotated token is cut off within seconds. With
    --issuer-seed, every other login is asked of the launcher (runctl.callout): each run's runner gets a login of its
    own without the configuration changing (the first time, restart nats-server: an auth callout is not reloadable).
    With $RUNCTL_SYSTEM_PASSWORD, nats-server's system account gets a user (`system`): given it as
    RUNCTL_BUS_SYSTEM_URL, the launcher closes the connections of run logins it revoked."""
    import bcrypt

    from runctl.errors import RunctlError
    from runctl.natsauth import ADMIN_USER, SERVICES_USER, SYSTEM_USER, NatsUser, server_config
    from runctl.natsjwt import NKey
    from runctl.stackbus import write_private

    SYSTEM_PASSWORD = "RUNCTL_SYSTEM_PASSWORD"

    def _hashed(variable: str) -> str:
        return bcrypt.hashpw(os.environ[variable].encode(), bcrypt.gensalt()).decode()

    passwords = {}
    for user, variable in ((SERVICES_USER, "RUNCTL_SERVICES_PASSWORD"), (ADMIN_USER, "RUNCTL_ADMIN_PASSWORD")):
        if not os.environ.get(variable):
            raise RunctlError(f"${variable} is not set, so the {user} user would have no password. Fix: set it.")
        passwords[user] = _hashed(variable)
    teams = [] if bootstrap else run_sync(lambda: _registry_call(lambda r: r.all()))
    text = server_config(
        listen,
        str(store),
        NatsUser(SERVICES_USER, passwords[SERVICES_USER]),
        NatsUser(ADMIN_USER, passwords[ADMIN_USER]),
        [t.nats_user() for t in teams],
        callout_issuer=None if issuer_seed is None else NKey.load(issuer_seed, create=True).public,
        system=NatsUser(SYSTEM_USER, _hashed(SYSTEM_PASSWORD)) if os.environ.get(SYSTEM_PASSWORD) else None,
    )
    write_private(out, text)
    new_console().print(
        f"wrote {out}: {len(teams)} team(s). Reload nats-server twice to apply it (kill -HUP <its pid>, twice: a "
        "team account added by a reload takes its imports at the next one)."
        + ("" if issuer_seed is None else f" Run logins: the launcher answers with the key in {issuer_seed}.")
    )
