"""Alembic's environment for the tracker's schema. Run by :func:`services.tracker.db.make_engine` (which hands in
its connection) or by the ``alembic`` command with ``-x url=<database URL>``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from services.tracker.db import Base, normalized_url

config = context.config
connection = config.attributes.get("connection")
if connection is not None:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("give the database: alembic -x url=sqlite:///path/tracker.db upgrade head")
    with create_engine(normalized_url(url)).begin() as conn:
        context.configure(connection=conn, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
