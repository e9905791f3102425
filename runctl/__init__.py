"""runctl: the control plane for agentic RL runs on LLMs. This package is the shared contract: configs, events,
subjects, the bus client, the SDK and the CLI. It imports nothing heavy."""

__version__ = "0.1.0"

from runctl import lean_imports

lean_imports.install()  # nats-py without the aiohttp it imports for a transport runctl never uses
