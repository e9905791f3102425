"""``python -m services.launcher``: admit validated runs and carry them through their phases."""

from runctl.service import run_service
from services.launcher.service import main
from services.launcher.settings import LauncherSettings

if __name__ == "__main__":
    run_service(main, "launcher", LauncherSettings)
