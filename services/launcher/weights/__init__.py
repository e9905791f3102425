"""Weight sync: after each update the replicas serve the new weights. ``base.WeightSync`` is the interface;
``reload.VllmReload`` reloads vLLM in place from a folder (a restart only when a reload fails); ``fake.FakeSync``
records what it was asked, for tests and the fake engine."""
