"""ENGINE=verl: train runs on GPU clusters through verl's own plugin points, no fork.

The runner (``engine.py``) writes runctl's files into the run folder (``prepare.py``), launches verl's trainer with
runctl's overrides (``runctl.verl``) as a child process attached to the run's Ray cluster, and publishes what verl
and runctl's plugins inside it leave behind: ``step.done`` from verl's file logger (``steplog.py``),
``checkpoint.saved`` from verl's checkpoint callback (``callback.py``), ``trial.finished`` from runctl's agent loop
(``agent_loop.py``, one trial per sample), both handed over through the run folder (``outbox.py``).

Only ``agent_loop.py`` imports verl; it runs inside verl's AgentLoopWorker actors.
"""
