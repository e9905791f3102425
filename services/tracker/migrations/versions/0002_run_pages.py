"""What the run pages read: metrics by step, checkpoints with their evals, trials, an index of events by kind;
the loop's expected size.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("progress_total", sa.Integer()))
    op.create_table(
        "metrics",
        sa.Column("run_id", sa.String(160), primary_key=True),
        sa.Column("key", sa.String(160), primary_key=True),
        sa.Column("step", sa.Integer(), primary_key=True),
        sa.Column("value", sa.Float()),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "checkpoints",
        sa.Column("run_id", sa.String(160), primary_key=True),
        sa.Column("step", sa.Integer(), primary_key=True),
        sa.Column("path", sa.String(1024)),
        sa.Column("format", sa.String(8)),
        sa.Column("num_bytes", sa.BigInteger()),
        sa.Column("time", sa.DateTime(timezone=True)),
        sa.Column("eval_run_id", sa.String(160)),
    )
    op.create_index("ix_checkpoints_eval_run_id", "checkpoints", ["eval_run_id"])
    op.create_table(
        "trials",
        sa.Column("event_id", sa.String(200), primary_key=True),
        sa.Column("run_id", sa.String(160), nullable=False),
        sa.Column("task", sa.String(256), nullable=False),
        sa.Column("trial", sa.Integer(), nullable=False),
        sa.Column("reward", sa.Float()),
        sa.Column("termination_reason", sa.String(32), nullable=False),
        sa.Column("durations_s", sa.JSON(), nullable=False),
        sa.Column("tokens", sa.JSON(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_trials_run_task", "trials", ["run_id", "task"])
    # A run page reads a few kinds of event among a long run's many steps and trials.
    op.create_index("ix_events_run_name_time", "events", ["run_id", "name", "time"])


def downgrade() -> None:
    op.drop_index("ix_events_run_name_time", "events")
    op.drop_table("trials")
    op.drop_table("checkpoints")
    op.drop_table("metrics")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("progress_total")
