"""``python -m services.validator``: validate every submitted config."""

from runctl.service import run_service
from services.validator.service import main

if __name__ == "__main__":
    run_service(main, "validator")
