"""The tracker's face: the one module of the tracker that code outside ``services/tracker`` imports.

``runctl tracker rebuild`` replays the event stream into a fresh database through it.
"""

from services.tracker.db import make_engine
from services.tracker.rebuild import rebuild
from services.tracker.settings import db_url

__all__ = ["db_url", "make_engine", "rebuild"]
