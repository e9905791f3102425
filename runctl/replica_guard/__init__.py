"""What each vLLM replica of a run loads from this folder (put first on its ``PYTHONPATH``, so that any Python with
vLLM finds it, whether or not runctl is installed beside it): ``runctl_replica_guard``."""
