"""The agents a trial can run: the terminal agent (runctl's own loop) and installed agents (a CLI in the sandbox)."""
