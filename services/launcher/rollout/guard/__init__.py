"""What each vLLM replica a run starts loads from this folder (put on its ``PYTHONPATH``): see
``runctl_replica_guard``."""
