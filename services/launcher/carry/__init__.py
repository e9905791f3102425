"""Carrying an admitted run to exactly one end: as a Ray job (the runner) or in the foreground."""
