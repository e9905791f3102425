"""Class 9, live: the bus answers, no other run of the experiment is in flight, and the ports a local Ray head
needs are free; class 4, live: the Ray cluster at RAY_ADDRESS has the nodes and GPUs the run needs. Each probe is
skipped, with the reason, when what it asks cannot be reached. (The sandbox probes are in ``sandbox_probes``.)"""

from __future__ import annotations

from services.validator.registry import Context, Verdict, check, fatal, ok, skip, warn

SERVICES = 9
RAY_HEAD_PORTS = (6379, 8265, 10001)
LIVE_STATES = ("submitted", "validated", "queued", "admitted", "starting", "running")


@check("services.bus", SERVICES, "a submission that cannot be delivered", live=True)
def bus_reachable(ctx: Context) -> Verdict:
    # Imported here, as in every probe: `runctl validate --static` must not pay for clients it does not use.
    import asyncio

    from runctl.bus import Bus
    from runctl.bus.client import masked_url, nats_url
    from runctl.errors import BusUnreachableError

    url = nats_url()
    shown = masked_url(url)

    async def probe() -> int:
        bus = await Bus.connect(url, name="runctl-validate")
        try:
            return int((await bus.js.account_info()).streams)
        finally:
            await bus.close()

    try:
        streams = asyncio.run(probe())
    except BusUnreachableError as e:
        return warn(f"the bus at {shown} does not answer: `runctl submit` will fail until it does.", e.message)
    return ok(f"bus at {shown} answers ({streams} JetStream streams)")


@check("services.no_conflicting_run", SERVICES, "two runs writing the same experiment's checkpoints", live=True)
def no_conflicting_run(ctx: Context) -> Verdict:
    import httpx

    from runctl.sdk import api_token, bearer, tracker_url

    c, url = ctx.config, tracker_url()
    params: dict[str, str | int] = {"team": c.team, "exp_name": c.exp_name, "limit": 500}
    try:
        reply = httpx.get(f"{url}/api/runs", params=params, headers=bearer(api_token()), timeout=2.0)
        runs = reply.raise_for_status().json()["runs"]
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


@check("services.ray_ports", SERVICES, "a local Ray head that cannot start", host=True)
def ray_ports(ctx: Context) -> Verdict:
    """A probe of the machine a foreground run executes on (``runctl run`` and the runner's own pass). With the live
    probes (``runctl submit``, ``runctl validate``) it is not asked: a submitted run's Ray is the launcher's (its
    cluster, or the one head it starts and shares between its runs)."""

    from runctl.ports import port_is_free

    c = ctx.config
    if c.engine == "fake":
        return skip("ENGINE=fake starts no Ray")
    if ctx.live:
        return skip("a submitted run gets its Ray from the launcher; `runctl run` checks these ports before it starts")
    if c.ray_address:
        return skip(f"RAY_ADDRESS={c.ray_address}: attaches to a running cluster")
    if ctx.settings.ray_address:
        return skip(f"inside the Ray cluster at $RAY_ADDRESS={ctx.settings.ray_address}: the runner attaches to it")
    taken = [port for port in RAY_HEAD_PORTS if not port_is_free(port)]
    if taken:
        return fatal(
            f"port(s) {', '.join(map(str, taken))} on 127.0.0.1 are taken: a local Ray head cannot start.",
            "stop what holds them, or set RAY_ADDRESS to a running Ray cluster.",
        )
    return ok(f"Ray head ports {', '.join(map(str, RAY_HEAD_PORTS))} are free")


TOPOLOGY = 4
RAY_DASHBOARD_PORT = 8265
PROBE_TIMEOUT_S = 5.0


def ray_dashboard_url(address: str) -> str:
    """The dashboard (state API) of the cluster at RAY_ADDRESS: an http(s) address as given, else its host on 8265."""
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    host = address.split("://", 1)[-1].rsplit(":", 1)[0]
    return f"http://{host}:{RAY_DASHBOARD_PORT}"


@check("topology.ray_cluster", TOPOLOGY, "a run that waits forever for nodes or GPUs the cluster lacks", live=True)
def ray_cluster(ctx: Context) -> Verdict:
    import httpx

    c = ctx.config
    if c.engine == "fake":
        return skip("ENGINE=fake starts no Ray")
    if not c.ray_address:
        return skip("RAY_ADDRESS unset: the runner starts a local Ray head (services.ray_ports checks its ports)")
    url = ray_dashboard_url(c.ray_address)
    from runctl.sdk import bearer

    headers = bearer(ctx.settings.ray_auth_token)  # a token-authenticated cluster's dashboard wants it too
    try:
        reply = httpx.get(f"{url}/api/v0/nodes", params={"limit": 10000}, headers=headers, timeout=PROBE_TIMEOUT_S)
        nodes = reply.raise_for_status().json()["data"]["result"]["result"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        return skip(f"the Ray dashboard at {url} does not answer ({type(e).__name__}: {e})")
    alive = [n for n in nodes if n.get("state") == "ALIVE"]
    gpus = {n.get("node_ip", "?"): int(n.get("resources_total", {}).get("GPU", 0)) for n in alive}
    fitting = [ip for ip, count in gpus.items() if count >= c.ngpus_per_node]
    seen = ", ".join(f"{ip} ({count} GPU)" for ip, count in gpus.items()) or "none"
    if len(alive) < c.nnodes:
        return fatal(
            f"the Ray cluster at {url} has {len(alive)} alive node(s) but NNODES={c.nnodes}: the run would wait for "
            f"nodes that are not there. Nodes seen: {seen}.",
            "start the missing nodes (ray start --address=...), or lower NNODES.",
        )
    if len(fitting) < c.nnodes:
        return fatal(
            f"only {len(fitting)} of the cluster's nodes have NGPUS_PER_NODE={c.ngpus_per_node} GPUs, and the run "
            f"needs {c.nnodes}. Nodes seen: {seen}.",
            "lower NGPUS_PER_NODE or NNODES to what the cluster has, or add GPU nodes.",
        )
    return ok(f"Ray cluster at {url}: {len(alive)} alive node(s), {sum(gpus.values())} GPU(s) ({seen})")
