"""Agent bundles: a scaffold's runtime and the agent, pinned, in one read-only folder a sandbox mounts.

A trial's sandbox has no network, so an agent cannot install itself there, nor fetch what it would on its first
run. ``runctl agents build NAME [--version V]`` makes the folder once, offline from where the machine's packages
come from (the package index pip is configured with), under ``bundles_root()/<name>-<version>/``:

- ``runtime/``: the interpreter the agent runs on — for a Python agent, a copy of this machine's CPython (its
  executable, ``libpython``, the standard library without its tests), whose own ``site-packages`` holds the agent
  and its dependencies at the pinned version, and whose ``lib`` holds every shared library those load from this
  machine but glibc's own (libssl, libffi, zlib…: ``carried_libraries`` in the manifest). It needs nothing of the
  host but glibc, as new as this machine's, so the same folder runs in a bubblewrap sandbox and in a Docker
  container (or a pod) of any image with glibc on the same platform. An npm agent's native executable needs glibc
  alone (its build checks), and its bundle carries such a runtime for the relay.
- ``prompt.txt``: what the agent sends before the task's own words (its system prompt and the frame around the
  task, rendered once at build time), which the validator counts in the model's tokens against its context.
- ``frames.json`` (mini-swe-agent's): its conversation's frames — the system message, the task's message, a command's
  observation, with marks where the task and the output go, and the expression its actions are read with — which
  ``runctl.tinymodel`` teaches the tiny model's scaffold shape under.
- ``manifest.json``: the agent, its version, the runtime's version and platform, every package installed with its
  version, the prompt's length, the agent's peak resident memory as it started (``peak_rss_mb``: an npm agent's while
  it sent its first request, a Python agent's while it imported itself and rendered its prompt), when it was built,
  and ``sha256``, a hash of every file's path, mode and content
  (:func:`tree_hash`): a trial records it, and a bundle whose files no longer hash to it is refused.

The folder is made under a temporary name, made read-only, and renamed into place: a bundle that exists is whole.
Agents' own telemetry and update checks are turned off by the scaffold that starts them (their environment).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runctl.errors import RunctlError

MANIFEST = "manifest.json"
#: The layout of a bundle this runctl builds and reads; a bundle of another is built again.
FORMAT = 5
#: Where a bundle's runtime lives inside the sandbox (bound read-only).
MOUNT = "/runctl/bundle"


class BundleError(RunctlError):
    """A bundle that cannot be built, is missing, or is not what its manifest says."""


@dataclass(frozen=True)
class Spec:
    """A scaffold's agent as a bundle is built of it."""

    name: str
    package: str
    default_version: str
    runtime: str  # "python" (a copy of this machine's CPython) — Node agents come with their scaffolds
    summary: str
    prompt_script: str = ""
    """Python run on the bundle's runtime with one argument, a file to write the agent's prompt to (its own
    templates rendered for an empty task); empty: not measured."""
    executable: str = ""
    """npm agents: the native executable under the install folder (``{platform}``: ``linux-x64``, say)."""
    capture_args: tuple[str, ...] = ()
    """npm agents: how to start the executable headless for one request, which a stand-in server on loopback (the
    Anthropic and OpenAI surfaces both) records as the agent's prompt (its system prompt, its messages before the
    task, its tools)."""
    capture_env: tuple[tuple[str, str], ...] = ()
    """npm agents: the environment that points the agent at the stand-in server (``{url}``: its address) with its
    update checks and telemetry off."""
    python: str = ""
    """Python agents: the CPython version the agent needs (``3.12``), found on this machine (``pythonX.Y`` on the
    path, or pyenv's); empty: the one runctl runs on."""
    extra: tuple[str, ...] = ()
    """Python agents: more packages installed beside the agent, pinned (``openhands-tools=={version}``)."""
    drop: tuple[str, ...] = ()
    """npm agents: globs under ``node_modules`` of packages npm installs that the bundle does not run (another
    build of the same executable for older CPUs, say), removed before the bundle is hashed."""


#: mini-swe-agent's text-based prompts (the ones mswea_run.py uses), rendered as its agent renders them; beside the
#: prompt, its conversation's frames (FRAMES: the system message, the task's message with TASK_MARK for the task, a
#: command's observation with OUTPUT_MARK for its output, and the regular expression its actions are read with),
#: which runctl.tinymodel teaches the tiny model under.
_MSWEA_PROMPT = r"""
import json, platform, sys
from pathlib import Path
import litellm, minisweagent, yaml  # litellm: mswea_run.py's start, measured as the agent's memory
from jinja2 import StrictUndefined, Template
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModelConfig
config = yaml.safe_load((Path(minisweagent.__file__).parent / "config" / "mini_textbased.yaml").read_text())
agent = config["agent"]
names = ("system", "node", "release", "version", "machine")
values = dict(zip(names, platform.uname()))
def render(template, **more):
    return Template(template, undefined=StrictUndefined).render(**values, **more)
text = "\n".join(render(agent[k], task="") for k in ("system_template", "instance_template"))
Path(sys.argv[1]).write_text(text)
task_mark, output_mark, frames_path = sys.argv[2:5]
output = {"returncode": 0, "output": output_mark, "exception_info": ""}
frames = {"system": render(agent["system_template"]), "instance": render(agent["instance_template"], task=task_mark),
          "observation": render(config["model"]["observation_template"], output=output),
          "action_regex": LitellmTextbasedModelConfig.model_fields["action_regex"].default}
Path(frames_path).write_text(json.dumps(frames, indent=1))
"""

#: OpenCode pointed at the stand-in server through an OpenAI-compatible provider (the one its scaffold configures).
_OPENCODE_CAPTURE = json.dumps(
    {
        "provider": {
            "build": {
                "npm": "@ai-sdk/openai-compatible",
                "options": {"baseURL": "{url}/v1", "apiKey": "runctl-build"},
                "models": {"model": {"name": "model"}},
            }
        },
        "model": "build/model",
        "small_model": "build/model",
        "autoupdate": False,
        "share": "disabled",
        "compaction": {"auto": False},
    }
)

#: The OpenHands SDK's agent as ohsdk_run.py makes it (its tools for a shell session), sent one message by a
#: conversation against the stand-in server: its first request is the agent's prompt.
_OHSDK_CAPTURE = r"""
import os
from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.task_tracker import TaskTrackerTool
from openhands.tools.terminal import TerminalTool
llm = LLM(model="openai/build", base_url=os.environ["OPENAI_BASE_URL"], api_key="runctl-build", num_retries=0)
tools = [Tool(name=TerminalTool.name, params={"terminal_type": "subprocess"}), Tool(name=FileEditorTool.name),
         Tool(name=TaskTrackerTool.name)]
conversation = Conversation(agent=Agent(llm=llm, tools=tools), workspace=os.getcwd(), max_iteration_per_run=1,
                            visualizer=None)
conversation.send_message("ok")
try:
    conversation.run()
except Exception:
    pass
"""

#: What the OpenHands SDK reads at start: no banner, no refusal of a short context (runctl's validator counts the
#: prompt against the served context instead), no telemetry.
OHSDK_ENV = (
    ("OPENHANDS_SUPPRESS_BANNER", "1"),
    ("ALLOW_SHORT_CONTEXT_WINDOWS", "true"),
    ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
    ("LITELLM_TELEMETRY", "False"),
)

SPECS: dict[str, Spec] = {
    "mswea": Spec("mswea", "mini-swe-agent", "2.4.6", "python", "mini-swe-agent, through litellm", _MSWEA_PROMPT),
    "cc": Spec(
        "cc",
        "@anthropic-ai/claude-code",
        "2.1.197",
        "npm",
        "Claude Code, its native executable",
        executable="node_modules/@anthropic-ai/claude-code-{platform}/claude",
        capture_args=(
            "-p",
            "ok",
            "--model",
            "runctl",
            "--output-format",
            "json",
            "--max-turns",
            "1",
            "--dangerously-skip-permissions",
        ),  # fmt: skip
        capture_env=(
            ("ANTHROPIC_BASE_URL", "{url}"),
            ("ANTHROPIC_API_KEY", "runctl-build"),
            ("IS_SANDBOX", "1"),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_AUTOUPDATER", "1"),
            ("DISABLE_TELEMETRY", "1"),
        ),
    ),
    "oc": Spec(
        "oc",
        "opencode-ai",
        "1.18.33",
        "npm",
        "OpenCode, its native executable",
        executable="node_modules/opencode-{platform}/bin/opencode",
        capture_args=("run", "--pure", "--title", "build", "--format", "json", "ok"),
        capture_env=(
            ("OPENCODE_CONFIG_CONTENT", _OPENCODE_CAPTURE),
            ("OPENCODE_DISABLE_AUTOUPDATE", "1"),
            ("OPENCODE_DISABLE_MODELS_FETCH", "1"),
            ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1"),
        ),
        drop=("opencode-*-baseline*", "opencode-*-musl*"),
    ),
    "ohsdk": Spec(
        "ohsdk",
        "openhands-sdk",
        "1.58.2",
        "python",
        "the OpenHands SDK's agent, on CPython 3.12",
        _OHSDK_CAPTURE,
        capture_env=(("OPENAI_BASE_URL", "{url}/v1"), *OHSDK_ENV),
        python="3.12",
        extra=("openhands-tools=={version}",),
    ),
}
PROMPT = "prompt.txt"
FRAMES = "frames.json"  # a text-based agent's conversation frames (mswea's), for teaching a model under them
TASK_MARK = "<<runctl-task>>"
OUTPUT_MARK = "<<runctl-output>>"


def bundles_root() -> Path:
    """``$RUNCTL_AGENTS_DIR``, else ``$XDG_CACHE_HOME/runctl/agents`` or ``~/.cache/runctl/agents``."""
    given = os.environ.get("RUNCTL_AGENTS_DIR")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "runctl" / "agents"


def spec_of(name: str) -> Spec:
    try:
        return SPECS[name]
    except KeyError:
        raise BundleError(f"no agent {name!r} has a bundle. Fix: one of {', '.join(sorted(SPECS))}.") from None


def bundle_path(name: str, version: str | None = None, root: Path | None = None) -> Path:
    spec = spec_of(name)
    return (root or bundles_root()) / f"{spec.name}-{version or spec.default_version}"


def platform_tag() -> str:
    return f"{platform.system().lower()}-{platform.machine()}"


def tree_hash(folder: Path) -> str:
    """sha256 over every file and link under ``folder`` but the manifest: its path, its mode's executable bit, and
    its content (a link: its target)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.name != MANIFEST or p.parent != folder):
        relative = path.relative_to(folder).as_posix()
        if path.is_symlink():
            digest.update(f"L {relative} {os.readlink(path)}\n".encode())
        elif path.is_file():
            executable = "x" if path.stat().st_mode & stat.S_IXUSR else "-"
            digest.update(f"F {relative} {executable} {path.stat().st_size}\n".encode())
            with path.open("rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: dict[str, object]

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def version(self) -> str:
        return str(self.manifest["version"])

    @property
    def sha256(self) -> str:
        return str(self.manifest["sha256"])

    @property
    def python(self) -> str:
        """The bundle's Python, as the sandbox sees it: a Python agent's runtime, or the one an npm agent's bundle
        carries for the relay to its proxy session."""
        return f"{MOUNT}/{self.manifest['python']}"

    @property
    def python_lib(self) -> str:
        """Where that Python's ``libpython`` is, inside the sandbox (its ``LD_LIBRARY_PATH``)."""
        return f"{MOUNT}/{self.manifest['python_lib']}"

    @property
    def executable(self) -> str:
        """The agent's executable (an npm agent's native one, a Python agent's interpreter), as the sandbox sees it."""
        return f"{MOUNT}/{self.manifest['executable']}"

    @property
    def peak_rss_mb(self) -> int | None:
        """The agent's peak resident memory as it started, measured when the bundle was built (None: not measured)."""
        peak = self.manifest.get("peak_rss_mb")
        return int(peak) if isinstance(peak, int) and peak > 0 else None

    def prompt(self) -> str:
        """What the agent sends before the task's own words (rendered when the bundle was built)."""
        return (self.path / PROMPT).read_text()

    def first_request(self) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
        """The first request with messages that a captured agent (Claude Code, OpenCode, the OpenHands SDK) sent when
        the bundle was built: its system prompt (an Anthropic request carries it apart from the messages; "" when
        it has none), its messages and its tools.

        Raises:
            BundleError: the bundle holds no captured request (mini-swe-agent's prompt is its rendered templates).
        """
        try:
            system, messages, tools = (json.loads(line) for line in self.prompt().splitlines())
        except (OSError, ValueError) as e:
            raise BundleError(
                f"the {self.name} bundle at {self.path} holds no captured first request ({PROMPT}: {e}): a "
                "text-based agent's (mini-swe-agent's) is its rendered templates; rebuild a captured agent's with "
                f"`runctl agents build {self.name}`."
            ) from e
        return system, messages, tools

    def record(self) -> dict[str, str]:
        """What a trial records of the bundle it ran."""
        return {"name": self.name, "version": self.version, "sha256": self.sha256}


def load(name: str, version: str | None = None, root: Path | None = None, verify: bool = False) -> Bundle:
    """The bundle of ``name`` at ``version`` (its default when None).

    Raises:
        BundleError: it is not built, or not for this platform, or (``verify``) its files do not hash to its
            manifest's ``sha256``.
    """
    path = bundle_path(name, version, root)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        raise BundleError(
            f"the {name} agent's bundle is not built ({path}). Fix: `runctl agents build {name}"
            + (f" --version {version}`" if version else "`")
            + " (it needs the package index once; trials then run offline)."
        ) from None
    if manifest.get("format") != FORMAT:
        raise BundleError(
            f"the bundle at {path} was built by another version of runctl (format {manifest.get('format')}, this one "
            f"reads {FORMAT}). Fix: `runctl agents build {name} --force`."
        )
    if manifest.get("platform") != platform_tag():
        raise BundleError(
            f"the bundle at {path} is for {manifest.get('platform')}, this machine is {platform_tag()}. Fix: build it "
            f"here (`runctl agents build {name} --force`)."
        )
    if verify and tree_hash(path) != manifest.get("sha256"):
        raise BundleError(
            f"the bundle at {path} no longer matches its manifest (a file was changed). Fix: `runctl agents build "
            f"{name} --force`."
        )
    return Bundle(path, manifest)


def find_python(version: str) -> str:
    """An interpreter of CPython ``version`` on this machine: runctl's own if it is that version, else ``pythonX.Y``
    on the path that runs, else pyenv's.

    Raises:
        BundleError: none found.
    """
    if not version or version == sysconfig.get_python_version():
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = [shutil.which(f"python{version}")] + sorted(str(p) for p in pyenv.glob(f"{version}*/bin/python{version}"))
    for candidate in found:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    raise BundleError(
        f"the agent needs CPython {version}, which is not on this machine (python{version} on the path, or pyenv's). "
        f"Fix: install it (`pyenv install {version}`, or the distribution's python{version} package)."
    )


_WHERE = (
    "import json, sys, sysconfig; print(json.dumps([sys.base_prefix, sysconfig.get_python_version(), "
    "sysconfig.get_path('stdlib', vars={'installed_base': sys.base_prefix})]))"
)


def _copy_python(runtime: Path, interpreter: str = sys.executable) -> str:
    """A copy of an interpreter's CPython under ``runtime`` (no site-packages, no tests); its executable's name."""
    base_text, version, stdlib_text = json.loads(
        subprocess.run([interpreter, "-c", _WHERE], capture_output=True, text=True, check=True).stdout
    )
    base, stdlib = Path(base_text), Path(stdlib_text)
    executable = f"python{version}"
    (runtime / "bin").mkdir(parents=True)
    shutil.copy2(base / "bin" / executable, runtime / "bin" / executable)
    (runtime / "bin" / "python3").symlink_to(executable)
    (runtime / "lib").mkdir()
    for lib in (base / "lib").glob("libpython*.so*"):
        shutil.copy2(lib, runtime / "lib" / lib.name, follow_symlinks=False)
    skip = {"site-packages", "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "__pycache__"}
    shutil.copytree(
        stdlib,
        runtime / "lib" / stdlib.name,
        ignore=lambda _d, names: [n for n in names if n in skip or n.startswith("_tkinter")],
    )
    (runtime / "lib" / stdlib.name / "site-packages").mkdir()
    return executable


#: glibc's own libraries (their sonames' beginnings): every image that runs glibc programs has them, and they must
#: match one another, so a bundle never carries them — what it needs of its host is glibc, as new as this machine's.
GLIBC = (
    "ld-linux", "libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "libresolv.so", "libutil.so",
    "libanl.so", "libmvec.so", "libnss_", "libBrokenLocale.so", "libthread_db.so", "libc_malloc_debug.so",
)  # fmt: skip


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _needed(elf: Path, lib: Path) -> dict[str, Path]:
    """The shared libraries ``elf`` loads that are not glibc's, by soname, as the loader finds them (``lib`` first)."""
    done = subprocess.run(
        ["ldd", str(elf)], capture_output=True, text=True, env={"LD_LIBRARY_PATH": str(lib), "PATH": "/usr/bin:/bin"}
    )
    found: dict[str, Path] = {}
    for line in done.stdout.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        target = rest.split(" (")[0].strip()
        if arrow and target.startswith("/") and not name.startswith(GLIBC):
            found[name] = Path(target)
    return found


def _carry_libraries(runtime: Path) -> list[str]:
    """Copy into ``runtime/lib`` every shared library that an executable or module under ``runtime`` loads from this
    machine, glibc's own aside (and theirs, until nothing new is needed), so that the runtime runs on any image with
    glibc (a task's Docker image need not have libssl, libffi, zlib…). The sonames carried, sorted."""
    lib = runtime / "lib"
    todo = [p for p in runtime.rglob("*") if p.is_file() and not p.is_symlink() and _is_elf(p)]
    carried: set[str] = set()
    while todo:
        elf = todo.pop()
        for name, source in _needed(elf, lib).items():
            if name in carried or source.is_relative_to(runtime):
                continue
            shutil.copy2(source, lib / name)  # the file the link points at, under the soname the loader asks for
            carried.add(name)
            todo.append(lib / name)
    return sorted(carried)


def runtime_env(runtime: Path) -> dict[str, str]:
    """The environment the runtime's interpreter runs with: its own ``libpython`` first, nothing of the user's site."""
    return {"LD_LIBRARY_PATH": str(runtime / "lib"), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def build(
    name: str,
    version: str | None = None,
    root: Path | None = None,
    force: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> Bundle:
    """Build the bundle (see the module's docstring); an existing one is kept unless ``force``."""
    spec = spec_of(name)
    version = version or spec.default_version
    final = bundle_path(name, version, root)
    if final.exists() and not force:
        try:
            return load(name, version, root)
        except BundleError as e:  # another format or platform, or half of one: built again
            say(f"building again: {e.what}")
            force = True
    final.parent.mkdir(parents=True, exist_ok=True)
    work = final.with_name(f".{final.name}.building-{os.getpid()}")
    _remove(work)
    started = time.monotonic()
    try:
        installed = (
            _install_python(spec, version, work, say)
            if spec.runtime == "python"
            else _install_npm(spec, version, work, say)
        )
        manifest: dict[str, object] = {
            "format": FORMAT,
            "name": spec.name,
            "package": spec.package,
            "version": version,
            "platform": platform_tag(),
            **installed,
            "built": time.time(),
            "build_seconds": round(time.monotonic() - started, 1),
        }
        if (work / PROMPT).exists():
            manifest["prompt_chars"] = len((work / PROMPT).read_text())
        _read_only(work)
        manifest["sha256"] = tree_hash(work)
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2))
        (work / MANIFEST).chmod(0o444)
        if final.exists() and force:
            _remove(final)
        try:
            work.rename(final)
        except OSError:
            if not (final / MANIFEST).exists():
                raise
            _remove(work)  # another build of the same bundle finished first: keep that one
            return load(name, version, root)
    except BaseException:
        _remove(work)
        raise
    say(f"built {final} in {time.monotonic() - started:.0f} s")
    return load(name, version, root)


def _install_python(spec: Spec, version: str, work: Path, say: Callable[[str], None]) -> dict[str, object]:
    interpreter = find_python(spec.python)
    say(f"copying this machine's Python {spec.python or platform.python_version()} ({interpreter}) into the bundle")
    executable = _copy_python(work / "runtime", interpreter)
    python = work / "runtime" / "bin" / executable
    env = {**os.environ, **runtime_env(work / "runtime")}
    packages = [f"{spec.package}=={version}", *(extra.format(version=version) for extra in spec.extra)]
    say(f"installing {', '.join(packages)} and their dependencies (from pip's configured index)")
    installed = subprocess.run(
        [interpreter, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
         "--no-warn-script-location", "--ignore-installed", "--prefix", str(work / "runtime"), *packages],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if installed.returncode != 0:
        raise BundleError(
            f"pip could not install {' '.join(packages)}: {installed.stderr.strip()[-1500:]}. Fix: check the "
            "version exists on the package index pip is configured with (pip's own message above)."
        )
    say("carrying the shared libraries it loads from this machine (all but glibc's own)")
    carried = _carry_libraries(work / "runtime")
    say("byte-compiling and checking that the agent imports in its runtime")
    subprocess.run([str(python), "-m", "compileall", "-q", "-j0", str(work / "runtime" / "lib")],
                   capture_output=True, env=env, check=False)  # fmt: skip
    frozen = subprocess.run([str(python), "-c", _FREEZE], capture_output=True, text=True, env=env)
    if frozen.returncode != 0:
        raise BundleError(f"the bundle's Python does not start: {frozen.stderr.strip()[-1500:]}")
    measured: dict[str, object] = {}
    if spec.prompt_script and spec.capture_env:
        say("recording the agent's first request, to count its prompt against a model's context")
        argv = [str(python), "-c", spec.prompt_script]
        prompt_text, measured["peak_rss_mb"] = _captured_prompt(argv, spec, work, runtime_env(work / "runtime"))
        (work / PROMPT).write_text(prompt_text)
    elif spec.prompt_script:
        say("rendering the agent's own prompt, to count against a model's context")
        argv = [str(python), "-c", spec.prompt_script, str(work / PROMPT), TASK_MARK, OUTPUT_MARK, str(work / FRAMES)]
        rendered, measured["peak_rss_mb"] = _measured(argv, work, env=env)
        if rendered.returncode != 0:
            raise BundleError(f"{spec.package} did not render its prompt: {rendered.stderr.strip()[-1500:]}")
    return {
        "runtime": f"python {executable.removeprefix('python')}",
        "python": f"runtime/bin/{executable}",
        "python_lib": "runtime/lib",
        "executable": f"runtime/bin/{executable}",
        "packages": json.loads(frozen.stdout),
        "carried_libraries": carried,
        **measured,
    }


def _install_npm(spec: Spec, version: str, work: Path, say: Callable[[str], None]) -> dict[str, object]:
    """An npm package whose platform package is a native executable: installed without its install scripts, run
    without Node (``Spec.executable`` names the executable under ``node_modules``)."""
    npm = shutil.which("npm")
    if npm is None:
        raise BundleError(f"building {spec.name}'s bundle needs npm, which is not on PATH. Fix: install Node and npm.")
    say(f"installing {spec.package}@{version} with npm (from its configured registry; no install scripts)")
    (work / "runtime").mkdir(parents=True)
    cache = work.with_name(work.name + ".npm-cache")
    try:
        installed = subprocess.run(
            [npm, "install", "--prefix", str(work / "runtime"), "--no-audit", "--no-fund", "--ignore-scripts",
             "--cache", str(cache), f"{spec.package}@{version}"],
            capture_output=True, text=True,
        )  # fmt: skip
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if installed.returncode != 0:
        raise BundleError(
            f"npm could not install {spec.package}@{version}: {installed.stderr.strip()[-1500:]}. Fix: check the "
            "version exists on the registry npm is configured with (npm's own message above)."
        )
    for pattern in spec.drop:
        for unused in (work / "runtime" / "node_modules").glob(pattern):
            shutil.rmtree(unused)
    executable = work / "runtime" / spec.executable.format(platform=_npm_platform())
    if not executable.is_file():
        raise BundleError(
            f"{spec.package}@{version} brought no executable for this platform at {executable.relative_to(work)}."
        )
    beyond_glibc = _needed(executable, work / "runtime")
    if beyond_glibc:
        raise BundleError(
            f"{spec.package}'s executable loads {', '.join(sorted(beyond_glibc))} beside glibc, which its bundle does "
            "not carry: it would not start in an image without them. Fix: pin a version whose executable is static "
            "but for glibc (--version)."
        )
    ran = subprocess.run([str(executable), "--version"], capture_output=True, text=True, timeout=60)
    if ran.returncode != 0:
        raise BundleError(f"{spec.package}'s executable does not start here: {ran.stderr.strip()[-1500:]}")
    packages = json.loads((work / "runtime" / "package-lock.json").read_text()).get("packages", {})
    pinned = sorted(
        (k.removeprefix("node_modules/"), v.get("version", ""))
        for k, v in packages.items()
        if k and (work / "runtime" / k).exists()
    )
    measured: dict[str, object] = {}
    if spec.capture_args:
        say("recording the agent's first request, to count its prompt against a model's context")
        prompt, measured["peak_rss_mb"] = _captured_prompt([str(executable), *spec.capture_args], spec, work)
        (work / PROMPT).write_text(prompt)
    say(f"copying this machine's Python {platform.python_version()} for the relay to the proxy")
    python = _copy_python(work / "python")
    carried = _carry_libraries(work / "python")  # the agent's executable needs glibc alone (checked below)
    return {
        "runtime": f"native ({ran.stdout.strip()[:80]})",
        "python": f"python/bin/{python}",
        "python_lib": "python/lib",
        "executable": str(executable.relative_to(work)),
        "packages": pinned,
        "carried_libraries": carried,
        **measured,
    }


def _captured_prompt(argv: list[str], spec: Spec, work: Path, env: dict[str, str] | None = None) -> tuple[str, int]:
    """The text of the first request with messages the agent sends (system, messages and tools), answered 400 by a
    stand-in server on loopback, in the surface's own error format, so that the agent stops there; and the agent's
    peak resident memory meanwhile, in MiB."""
    import http.server
    import threading

    bodies: list[bytes] = []

    class StandIn(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers.get("content-length") or 0)))
            if self.path.endswith("/chat/completions"):
                answer = b'{"object": "error", "message": "recorded", "type": "BadRequestError", "code": 400}'
            else:
                answer = b'{"type": "error", "error": {"type": "invalid_request_error", "message": "recorded"}}'
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    home = work.with_name(work.name + ".home")
    home.mkdir()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    env = {**(env or {}), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    env |= {"XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache")}
    env |= {"XDG_DATA_HOME": str(home / ".data")}
    env |= {key: value.replace("{url}", url) for key, value in spec.capture_env}
    try:
        _, peak_mb = _measured(argv, work, 120, env=env, cwd=home)
    finally:
        server.shutdown()
        shutil.rmtree(home, ignore_errors=True)
    requests = [json.loads(b) for b in bodies if b.strip()]
    first = next((r for r in requests if r.get("messages")), None)
    if first is None:
        raise BundleError(f"{spec.package} sent no request with messages to the stand-in server within 120 s.")
    # One JSON document a line, as Bundle.first_request reads them.
    parts = [json.dumps(first.get("system") or ""), json.dumps(first["messages"]), json.dumps(first.get("tools") or [])]
    return "\n".join(parts), peak_mb


#: Runs argv[3:] as its one child, killed after argv[2] seconds, and writes the child's peak resident memory in KiB
#: to argv[1] (a fresh process's RUSAGE_CHILDREN is its one child's, and that child's own children's).
_PEAK = (
    "import resource, subprocess, sys\n"
    "try:\n"
    "    code = subprocess.run(sys.argv[3:], timeout=float(sys.argv[2])).returncode\n"
    "except subprocess.TimeoutExpired:\n"
    "    code = 124\n"
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(code)\n"
)


def _measured(
    argv: list[str], work: Path, timeout_s: float = 600, **run: object
) -> tuple[subprocess.CompletedProcess[str], int]:
    """``subprocess.run(argv)`` (text output captured, killed after ``timeout_s``) and the peak resident memory of what
    it started, in MiB."""
    peak = work.with_name(work.name + ".peak")
    try:
        done: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
            [sys.executable, "-c", _PEAK, str(peak), str(timeout_s), *argv], capture_output=True, text=True, **run
        )
        kib = int(peak.read_text()) if peak.exists() else 0
    finally:
        peak.unlink(missing_ok=True)
    return done, -(-kib // 1024)


def _npm_platform() -> str:
    machine = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    return f"{platform.system().lower()}-{machine}"


_FREEZE = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted({d.metadata['Name'].lower(): d.version for d in m.distributions()}.items())))"
)


def _read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def build_many(
    names: list[str], version: str | None = None, force: bool = False, say: Callable[[str], None] = print
) -> list[Bundle]:
    """Build several bundles side by side (their builds wait on the package index and on pip more than on a core),
    each line of progress led by its agent's name, then one line per bundle built; one :class:`BundleError` names
    every agent whose build failed."""
    from concurrent.futures import ThreadPoolExecutor

    names = list(dict.fromkeys(names))
    if version is not None and len(names) > 1:
        raise BundleError(
            f"--version {version} names one agent's version, but {len(names)} agents were given. Fix: build them one "
            "at a time, each with its own --version."
        )

    def one(name: str) -> Bundle:
        return build(name, version, force=force, say=(lambda line: say(f"  {name}: {line}")) if len(names) > 1 else say)

    built: list[Bundle] = []
    failed: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        for name, future in [(name, pool.submit(one, name)) for name in names]:
            try:
                bundle = future.result()
            except BundleError as e:
                failed.append(f"{name}: {e}")
                continue
            say(f"{bundle.name} {bundle.version}: {bundle.path} (sha256 {bundle.sha256[:16]}…)")
            built.append(bundle)
    if failed:
        raise BundleError("; ".join(failed))
    return built


def main(argv: list[str]) -> int:
    """``python -m runctl.bundles NAME…``: :func:`build_many` on the standard library alone, so that a machine's
    setup can build the bundles while it is still installing runctl's own environment (``.ci/run`` does)."""
    if not argv or argv[0].startswith("-"):
        print(f"usage: python -m runctl.bundles NAME...  (NAME: {', '.join(SPECS)})", file=sys.stderr)
        return 2
    try:
        build_many(argv)
    except BundleError as e:
        print(str(e), file=sys.stderr)
        return 1
    return 0


def _remove(folder: Path) -> None:
    if not folder.exists():
        return
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink() and path.is_dir():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    shutil.rmtree(folder)


def all_built(root: Path | None = None) -> list[Bundle]:
    found = []
    base = root or bundles_root()
    for path in sorted(base.glob("*/" + MANIFEST)) if base.exists() else []:
        name = path.parent.name.rsplit("-", 1)[0]
        if name in SPECS:
            try:
                found.append(load(name, path.parent.name.rsplit("-", 1)[1], root))
            except BundleError:
                continue
    return found


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
