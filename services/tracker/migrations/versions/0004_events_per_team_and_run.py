"""An event is known by its team, its run and its id together (not its id alone), and a trial by its run and its
event's id: another team's event with the same id is stored beside the first, never in its place.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

#: Names for the constraint 0001 left unnamed, as SQLite's batch mode reflects it.
NAMES = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # PostgreSQL named them itself
        op.drop_constraint("events_id_key", "events", type_="unique")
        op.create_unique_constraint("uq_events_team_run_id", "events", ["team", "run_id", "id"])
        op.drop_constraint("trials_pkey", "trials", type_="primary")
        op.create_primary_key("trials_pkey", "trials", ["run_id", "event_id"])
        return
    with op.batch_alter_table("events", naming_convention=NAMES) as batch:
        batch.drop_constraint("uq_events_id", type_="unique")
        batch.create_unique_constraint("uq_events_team_run_id", ["team", "run_id", "id"])
    # SQLite cannot change a primary key in place: the trials move to a table made with the new one.
    op.create_table(
        "_trials_new",
        sa.Column("run_id", sa.String(160), primary_key=True),
        sa.Column("event_id", sa.String(200), primary_key=True),
        sa.Column("task", sa.String(256), nullable=False),
        sa.Column("trial", sa.Integer(), nullable=False),
        sa.Column("reward", sa.Float()),
        sa.Column("termination_reason", sa.String(32), nullable=False),
        sa.Column("durations_s", sa.JSON(), nullable=False),
        sa.Column("tokens", sa.JSON(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
    )
    columns = "run_id, event_id, task, trial, reward, termination_reason, durations_s, tokens, time"
    op.execute(f"INSERT INTO _trials_new ({columns}) SELECT {columns} FROM trials")
    op.drop_index("ix_trials_run_task", "trials")
    op.drop_table("trials")
    op.rename_table("_trials_new", "trials")
    op.create_index("ix_trials_run_task", "trials", ["run_id", "task"])


def downgrade() -> None:
    raise NotImplementedError("the tracker's schema is only migrated forward: rebuild it from the streams instead")
