"""Class 8, probes: the sandbox backend the run will use, where it will use it — bubblewrap on this machine
(BACKEND=local), the Docker daemon at DOCKER_HOST and the images the tasks need (BACKEND=docker), the Kubernetes
API, namespace and rights (BACKEND=k8s). The first two are probes of this machine (``runctl run`` and the runner
run them too); the Kubernetes one is a live probe of a cluster, skipped with the reason when it cannot be reached."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from runctl.safefiles import read_regular
from services.validator.checks.config_paths import indexed_tasks
from services.validator.registry import Context, Verdict, check, fatal, ok, skip, warn

if TYPE_CHECKING:
    from runctl.config.models import RunConfig
    from runctl.tasks import Task

SANDBOX = 8
PROBE_TIMEOUT_S = 5.0
MAX_IMAGES_PROBED = 200


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
    wanted: dict[str, str] = {}
    for task in indexed_tasks(ctx):
        image = task.image_name(ctx.config.image_registry)
        if image:
            wanted.setdefault(image, f"task {task.id}")
        elif task.environment_file is not None and task.environment_file.name == "Dockerfile":
            for base in dockerfile_bases(_dockerfile_text(task.environment_file)):
                wanted.setdefault(base, f"the base of task {task.id}")
    return wanted


def _dockerfile_text(path: Path) -> str:
    """A task's Dockerfile, read only when it is a regular file of bounded size (it is the team's file)."""
    return read_regular(path, what="Dockerfile").decode(errors="replace")


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


@check(
    "sandbox.docker",
    SANDBOX,
    "every trial failing at sandbox set-up: no Docker daemon where the run will look, or no image",
    host=True,
)
def docker_daemon(ctx: Context) -> Verdict:
    c = ctx.config
    if c.backend != "docker":
        return skip(f"BACKEND={c.backend}")
    if c.engine == "fake":
        return skip("ENGINE=fake makes no sandbox")
    import docker
    import docker.errors
    import requests

    from runctl.probe import socket_unreachable
    from services.sandbox.library import docker_host  # the sandbox service's public face: the runner asks it too

    host = docker_host(c.docker_host)
    fix = "start dockerd there, or set DOCKER_HOST to a daemon that runs, or use BACKEND=local"
    unreachable = socket_unreachable(host)
    if unreachable:
        return fatal(f"the Docker daemon at {host} does not answer ({unreachable}): no sandbox can start.", fix)
    try:
        client = docker.DockerClient(base_url=host, timeout=int(PROBE_TIMEOUT_S))
        version = client.version()["Version"]
    except (docker.errors.DockerException, requests.RequestException, KeyError) as e:
        return fatal(f"the Docker daemon at {host} does not answer ({type(e).__name__}: {e}).", fix)
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


@check(
    "sandbox.local",
    SANDBOX,
    "every trial failing at sandbox set-up: no bubblewrap here, or a task the local backend cannot build",
    host=True,
)
def local_backend(ctx: Context) -> Verdict:
    c = ctx.config
    if c.backend != "local":
        return skip(f"BACKEND={c.backend}")
    if c.engine == "fake":
        return skip("ENGINE=fake makes no sandbox")
    from services.sandbox.library import (
        local_backend_problem,
        local_disk_problem,
        local_limits_problem,
        local_public_problem,
        local_task_problem,
    )

    problem = local_backend_problem()
    if problem is not None:
        message, _, fix = problem.partition(" Fix: ")
        return fatal(message, fix or "install bubblewrap, or set BACKEND=docker.")
    tasks = indexed_tasks(ctx)
    public = [t.id for t in tasks if "public" in _networks(c, t)]
    if public and (problem := local_public_problem()) is not None:
        message, _, fix = problem.partition(" Fix: ")
        return fatal(f"{len(public)} task(s) ({', '.join(public[:3])}) get a public network: {message}", fix)
    refused = [p for task in tasks if (p := local_task_problem(task)) is not None]
    if refused:
        return fatal(
            f"{len(refused)} of {len(tasks)} task(s) cannot run on the local backend: "
            + "; ".join(p.partition(" Fix: ")[0] for p in refused[:3])
            + ("; …" if len(refused) > 3 else ""),
            "use BACKEND=docker for tasks that build their image, or drop those tasks from the index.",
        )
    unlimited = local_limits_problem()
    if unlimited is not None:
        return warn(
            f"local sandboxes get no cgroup limits here ({unlimited}): memory and processes are capped per command "
            "by resource limits only, CPU not at all",
            "run the sandbox service and runners as root on a host with cgroup v1 or v2, or set BACKEND=docker.",
        )
    sized = [t.id for t in tasks if t.config.environment.storage_mb]
    if sized and (no_disk := local_disk_problem()) is not None:
        return warn(
            f"{len(sized)} task(s) ({', '.join(sized[:3])}) set storage_mb, which local sandboxes cannot hold here "
            f"({no_disk}): their disk use is not limited",
            "run the sandbox service and runners as root on a host with loop devices, or set BACKEND=docker on a "
            "storage driver that limits containers.",
        )
    return ok(f"bubblewrap makes sandboxes here; {len(tasks)} task(s) need nothing it cannot do")


#: What a sandbox needs beside the agent itself: the relay to the proxy, the shell, the commands the agent runs.
AGENT_HEADROOM_MB = 64


@check(
    "sandbox.agent_memory",
    SANDBOX,
    "every trial on those tasks killed as it starts: the agent alone needs more memory than the sandbox has",
)
def agent_memory(ctx: Context) -> Verdict:
    from runctl import bundles

    c = ctx.config
    if c.scaffold not in bundles.SPECS or c.engine == "fake":
        return skip(f"SCAFFOLD={c.scaffold} runs no bundled agent in the sandbox")
    try:
        peak = bundles.load(c.scaffold, c.agent_version).peak_rss_mb
    except bundles.BundleError:
        return skip("the bundle is not built (model.agent_bundle says so)")
    if peak is None:
        return skip(f"SCAFFOLD={c.scaffold}'s bundle has no measured memory (built by an older runctl)")
    need = peak + AGENT_HEADROOM_MB
    tasks = indexed_tasks(ctx)
    memory = {t.id: c.sandbox_memory_mb or t.config.environment.memory_mb for t in tasks}
    killed = [task for task, mb in memory.items() if mb <= peak]
    tight = [task for task, mb in memory.items() if peak < mb < need]
    measured = f"SCAFFOLD={c.scaffold}'s agent reached {peak} MiB as it started (measured when its bundle was built)"
    fix = (
        f"SANDBOX_MEMORY_MB={need} or more (it overrides every task's [environment] memory_mb), or raise those tasks' "
        "memory_mb."
    )
    if killed:
        return fatal(
            f"{measured}, but {len(killed)} of {len(tasks)} task(s) ({', '.join(killed[:3])}) give the sandbox "
            f"{min(memory[t] for t in killed)} MiB or less: the agent is killed before it answers.",
            fix,
        )
    if tight:
        return warn(
            f"{measured}; {len(tight)} task(s) ({', '.join(tight[:3])}) leave it less than {AGENT_HEADROOM_MB} MiB "
            "for the relay and the commands it runs.",
            fix,
        )
    return ok(f"SCAFFOLD={c.scaffold}'s agent needs about {need} MiB; every one of {len(tasks)} task(s) has that")


def _networks(c: RunConfig, task: Task) -> set[str]:
    """The networks a task's sandboxes get under this config (the agent's, and a separate verifier's)."""
    found: set[str] = {c.agent_network or task.config.environment.network_mode or "no-network"}
    if task.config.verifier.separate:
        found.add(c.verifier_network or task.verifier_view().config.environment.network_mode or "no-network")
    return found


def _kube_client(ctx: Context) -> object:
    from kubernetes import client, config

    from services.sandbox.library import kubeconfig_path  # where the runner looks too

    path = kubeconfig_path(ctx.config.kubeconfig)
    if path:
        return config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
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
    claim = c.k8s_bundle_claim
    modes: list[str] | None = None
    try:
        host = api_client.configuration.host  # type: ignore[attr-defined]
        core = client.CoreV1Api(api_client)
        core.read_namespace(ns, _request_timeout=PROBE_TIMEOUT_S)
        allowed = _can_create_pods(api_client, ns)
        if claim:
            found = core.read_namespaced_persistent_volume_claim(claim, ns, _request_timeout=PROBE_TIMEOUT_S)
            modes = list(found.spec.access_modes or []) if found.spec else []
    except client.ApiException as e:
        if e.status == 404 and claim and "persistentvolumeclaims" in str(e.body):
            return fatal(
                f"the bundle claim {claim} (K8S_BUNDLE_CLAIM) does not exist in namespace {ns} on {host}: every "
                "sandbox pod would wait for it.",
                "create the PersistentVolumeClaim holding the runner's agent bundles (ReadOnlyMany), or name the one "
                "that does.",
            )
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
    if modes is not None and not {"ReadOnlyMany", "ReadWriteMany"} & set(modes):
        return warn(
            f"the bundle claim {claim} is {', '.join(modes) or 'of no access mode'}: pods on more than one node "
            "cannot mount it at once, so sandboxes scheduled elsewhere wait.",
            "give the bundles a ReadOnlyMany (or ReadWriteMany) claim.",
        )
    with_claim = f"; the bundle claim {claim} exists" if claim else ""
    return ok(f"Kubernetes API at {host} answers; namespace {ns} exists and pods may be created{with_claim}")
