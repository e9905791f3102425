"""The trainer of ENGINE=local train runs: TRL's GRPO fed by runctl's own trial loop, checkpoints, and the sequences
the proxy captured turned into training samples."""
