"""The launcher's face: the one module of the launcher that code outside ``services/launcher`` imports.

``runctl run`` carries a run in the foreground (mirroring its events to a bus when one answers); the demo and the
GPU smoke name the eval runs the launcher starts on each checkpoint.
"""

from services.launcher.carry.foreground import BusMirror, run_foreground
from services.launcher.evalstore import eval_run_id

__all__ = ["BusMirror", "eval_run_id", "run_foreground"]
