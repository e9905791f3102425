"""Class 9, live: the bus answers, no other run of the experiment is in flight, and the ports a local Ray head
needs are free. Each probe is skipped, with the reason, when what it asks cannot be reached."""

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
    from runctl.bus.client import nats_url
    from runctl.errors import BusUnreachableError

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
        runs = httpx.get(f"{url}/api/runs", params=params, timeout=2.0).raise_for_status().json()["runs"]
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
    from runctl.stack import port_is_free

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


TOPOLOGY = 4
SANDBOX = 8
RAY_DASHBOARD_PORT = 8265
PROBE_TIMEOUT_S = 5.0
MAX_IMAGES_PROBED = 200


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
    try:
        reply = httpx.get(f"{url}/api/v0/nodes", params={"limit": 10000}, timeout=PROBE_TIMEOUT_S)
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


def docker_host(ctx: Context) -> str:
    import os

    return ctx.config.docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def dockerfile_bases(dockerfile: str) -> list[str]:
    """The images a Dockerfile builds FROM, less earlier stages, ``scratch`` and names built from ARGs."""
    bases: list[str] = []
    stages: set[str] = set()
    for line in dockerfile.splitlines():
        words = line.split()
        if len(words) < 2 or words[0].upper() != "FROM":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if not args:
            continue
        if len(args) >= 3 and args[1].upper() == "AS":
            stages.add(args[2].lower())
        image = args[0]
        if image.lower() not in stages and image != "scratch" and "$" not in image:
            bases.append(image)
    return bases


def _wanted_images(ctx: Context) -> dict[str, str]:
    """image → why it is needed (a prebuilt task image, or the base a task's Dockerfile builds from)."""
    from services.validator.checks.config_paths import indexed_tasks

    wanted: dict[str, str] = {}
    for task in indexed_tasks(ctx):
        image = task.image_name(ctx.config.image_registry)
        if image:
            wanted.setdefault(image, f"task {task.id}")
        elif task.environment_file is not None and task.environment_file.name == "Dockerfile":
            for base in dockerfile_bases(task.environment_file.read_text(errors="replace")):
                wanted.setdefault(base, f"the base of task {task.id}")
    return wanted


def _image_problem(client: object, image: str) -> tuple[str, str] | None:
    """None when the image is local or the registry has it; else (severity, what is wrong)."""
    import docker.errors

    images = client.images  # type: ignore[attr-defined]
    try:
        images.get(image)
        return None
    except docker.errors.ImageNotFound:
        pass
    try:
        images.get_registry_data(image)
        return None
    except docker.errors.NotFound:
        return ("fatal", f"{image} is neither on the daemon nor in its registry")
    except docker.errors.APIError as e:
        return ("warn", f"{image} is not on the daemon and its registry could not be asked ({e.explanation})")


@check("sandbox.docker", SANDBOX, "every trial failing at sandbox set-up: no Docker daemon, or no image", live=True)
def docker_daemon(ctx: Context) -> Verdict:
    c = ctx.config
    if c.backend != "docker":
        return skip(f"BACKEND={c.backend}")
    import docker
    import docker.errors
    import requests

    from runctl.probe import socket_unreachable

    host = docker_host(ctx)
    unreachable = socket_unreachable(host)
    if unreachable:
        return skip(f"the Docker daemon at {host} does not answer ({unreachable})")
    try:
        client = docker.DockerClient(base_url=host, timeout=int(PROBE_TIMEOUT_S))
        version = client.version()["Version"]
    except (docker.errors.DockerException, requests.RequestException, KeyError) as e:
        return skip(f"the Docker daemon at {host} does not answer ({type(e).__name__}: {e})")
    try:
        wanted = _wanted_images(ctx)
        problems = [
            (why, p) for image, why in list(wanted.items())[:MAX_IMAGES_PROBED] if (p := _image_problem(client, image))
        ]
    finally:
        client.close()
    shown = "; ".join(f"{text} (needed by {why})" for why, (_, text) in problems[:3])
    if any(severity == "fatal" for _, (severity, _) in problems):
        return fatal(
            f"{len(problems)} image(s) cannot be had: {shown}.",
            "build or push the images, or fix IMAGE_REGISTRY / the tasks' docker_image and FROM lines.",
        )
    if problems:
        return warn(f"{shown}.", "check the registry is reachable from the daemon, or load the images.")
    return ok(f"Docker {version} at {host} answers; {len(wanted)} image(s) needed are available")


def _kube_client(ctx: Context) -> object:
    from kubernetes import client, config

    if ctx.config.kubeconfig:
        return config.new_client_from_config(config_file=ctx.config.kubeconfig)  # type: ignore[no-untyped-call]
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def _can_create_pods(api_client: object, namespace: str) -> bool:
    from kubernetes import client

    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(namespace=namespace, verb="create", resource="pods")
        )
    )
    answer = client.AuthorizationV1Api(api_client).create_self_subject_access_review(
        review, _request_timeout=PROBE_TIMEOUT_S
    )
    return bool(answer.status and answer.status.allowed)


@check("sandbox.kubernetes", SANDBOX, "sandbox pods that cannot be created: no API, no namespace, no rights", live=True)
def kubernetes_api(ctx: Context) -> Verdict:
    c = ctx.config
    if c.backend != "k8s":
        return skip(f"BACKEND={c.backend}")
    from kubernetes import client
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    ns = c.k8s_namespace
    try:
        api_client = _kube_client(ctx)
    except (ConfigException, OSError, ValueError) as e:
        return skip(f"no Kubernetes credentials ({e})")
    try:
        host = api_client.configuration.host  # type: ignore[attr-defined]
        client.CoreV1Api(api_client).read_namespace(ns, _request_timeout=PROBE_TIMEOUT_S)
        allowed = _can_create_pods(api_client, ns)
    except client.ApiException as e:
        if e.status == 404:
            return fatal(f"namespace {ns} does not exist on {host}.", f"create it (kubectl create namespace {ns}).")
        return fatal(
            f"the Kubernetes API at {host} refused the request ({e.status} {e.reason}).",
            "check the credentials in KUBECONFIG.",
        )
    except HTTPError as e:
        return skip(f"the Kubernetes API at {host} does not answer ({type(e).__name__})")
    finally:
        api_client.close()  # type: ignore[attr-defined]
    if not allowed:
        return fatal(
            f"these credentials may not create pods in namespace {ns} on {host}.",
            "grant them a Role with create/get/list/delete on pods and pods/exec in that namespace.",
        )
    return ok(f"Kubernetes API at {host} answers; namespace {ns} exists and pods may be created")
