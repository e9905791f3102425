"""``python -m services.tracker``: project every event into SQL and serve the HTTP API."""

from runctl.service import run_service
from services.tracker.service import main
from services.tracker.settings import TrackerSettings

if __name__ == "__main__":
    run_service(main, "tracker", TrackerSettings)
