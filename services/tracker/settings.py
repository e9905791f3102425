"""The tracker's settings (``RUNCTL_DB_URL``, ``RUNCTL_TRACKER_*``), read once when the service starts; ``runctl
tracker rebuild`` reads the same database setting."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from runctl.settings import ServiceSettings

DEFAULT_PORT = 8750


class TrackerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="RUNCTL_TRACKER_")

    db_url: str | None = Field(None, validation_alias="RUNCTL_DB_URL")
    """The SQL database of the run record, as an SQLAlchemy URL (``postgresql+psycopg://…``); unset: SQLite at
    ``$RUNCTL_HOME/tracker.db``."""
    host: str = "127.0.0.1"
    """The address the HTTP API and the dashboard listen on."""
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    """The port of the HTTP API and the dashboard."""

    def database(self) -> str:
        """The database URL: ``RUNCTL_DB_URL``, else SQLite at ``$RUNCTL_HOME/tracker.db`` (its folder made)."""
        if self.db_url:
            return self.db_url
        from runctl.home import home, private_file, private_folder

        base = private_folder(home())
        return f"sqlite:///{private_file(base / 'tracker.db')}"


def db_url() -> str:
    """The database this environment names (see :meth:`TrackerSettings.database`)."""
    return TrackerSettings.from_env().database()
