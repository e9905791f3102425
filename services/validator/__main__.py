"""``python -m services.validator``: validate every submitted config."""

from runctl.service import run_service
from services.validator.service import main
from services.validator.settings import ValidatorSettings

if __name__ == "__main__":
    run_service(main, "validator", ValidatorSettings)
