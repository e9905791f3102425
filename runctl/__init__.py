"""runctl: the control plane for agentic RL runs on LLMs. This package is the shared contract: configs, events,
subjects, the bus client, the SDK and the CLI. It imports nothing heavy."""

__version__ = "0.1.0"
