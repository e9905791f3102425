"""Rollouts: the Ray cluster, the vLLM replicas, the trial loop in sandboxes, the agents, scores."""
