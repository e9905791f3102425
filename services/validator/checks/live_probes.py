"""Class 9, live: the bus answers, no other run of the experiment is in flight, and the ports a local Ray head
needs are free. Each probe is skipped, with the reason, when what it asks cannot be reached."""

from __future__ import annotations

import asyncio

from runctl.bus.client import nats_url
from runctl.errors import BusUnreachableError
from runctl.stack import port_is_free
from services.validator.registry import Context, Verdict, check, fatal, ok, skip, warn

SERVICES = 9
RAY_HEAD_PORTS = (6379, 8265, 10001)
LIVE_STATES = ("submitted", "validated", "queued", "admitted", "starting", "running")


@check("services.bus", SERVICES, "a submission that cannot be delivered", live=True)
def bus_reachable(ctx: Context) -> Verdict:
    from runctl.bus import Bus

    url = nats_url()

    async def probe() -> int:
        bus = await Bus.connect(url, name="runctl-validate")
        try:
            return int((await bus.js.account_info()).streams)
        finally:
            await bus.close()

    try:
        streams = asyncio.run(probe())
    except BusUnreachableError as e:
        return warn(f"the bus at {url} does not answer: `runctl submit` will fail until it does.", e.message)
    return ok(f"bus at {url} answers ({streams} JetStream streams)")


@check("services.no_conflicting_run", SERVICES, "two runs writing the same experiment's checkpoints", live=True)
def no_conflicting_run(ctx: Context) -> Verdict:
    import httpx

    from runctl.sdk import tracker_url

    c, url = ctx.config, tracker_url()
    params: dict[str, str | int] = {"team": c.team, "exp_name": c.exp_name, "limit": 500}
    try:
        runs = httpx.get(f"{url}/runs", params=params, timeout=2.0).raise_for_status().json()["runs"]
    except (httpx.HTTPError, ValueError, KeyError) as e:
        return skip(f"the tracker at {url} does not answer ({type(e).__name__})")
    live = [r for r in runs if r.get("state") in LIVE_STATES and r.get("project_name") == c.project_name]
    if live:
        shown = ", ".join(f"{r['run_id']} ({r['state']})" for r in live[:3])
        return fatal(
            f"{c.project_name}/{c.exp_name} is already in flight: {shown}. Two runs would write the same "
            "checkpoint and trial folders.",
            f"cancel it (`runctl cancel {live[0]['run_id']}`) or change EXP_NAME.",
        )
    return ok(f"no other run of {c.project_name}/{c.exp_name} in flight")


@check("services.ray_ports", SERVICES, "a local Ray head that cannot start", live=True)
def ray_ports(ctx: Context) -> Verdict:
    c = ctx.config
    if c.engine == "fake":
        return skip("ENGINE=fake starts no Ray")
    if c.ray_address:
        return skip(f"RAY_ADDRESS={c.ray_address}: attaches to a running cluster")
    taken = [port for port in RAY_HEAD_PORTS if not port_is_free(port)]
    if taken:
        return fatal(
            f"port(s) {', '.join(map(str, taken))} on 127.0.0.1 are taken: a local Ray head cannot start.",
            "stop what holds them, or set RAY_ADDRESS to a running Ray cluster.",
        )
    return ok(f"Ray head ports {', '.join(map(str, RAY_HEAD_PORTS))} are free")
