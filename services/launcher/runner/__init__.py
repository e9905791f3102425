"""The runner: the phases of an infer or eval run on Ray, vLLM replicas, the proxy and sandboxes."""
