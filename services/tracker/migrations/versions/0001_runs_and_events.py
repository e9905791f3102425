"""Runs and their events.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(160), primary_key=True),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16)),
        sa.Column("run_type", sa.String(8)),
        sa.Column("project_name", sa.String(128)),
        sa.Column("exp_name", sa.String(128)),
        sa.Column("engine", sa.String(16)),
        sa.Column("submitter", sa.String(256)),
        sa.Column("submitted_at", sa.DateTime(timezone=True)),
        sa.Column("updated_at", sa.DateTime(timezone=True)),
        sa.Column("ended_at", sa.DateTime(timezone=True)),
        sa.Column("phase", sa.String(16)),
        sa.Column("last_step", sa.Integer()),
        sa.Column("num_trials", sa.Integer(), nullable=False),
        sa.Column("num_events", sa.Integer(), nullable=False),
        sa.Column("score", sa.Float()),
        sa.Column("synthetic", sa.Boolean(), nullable=False),
        sa.Column("resolved", sa.JSON()),
        sa.Column("summary", sa.JSON()),
        sa.Column("error", sa.JSON()),
    )
    op.create_index("ix_runs_team", "runs", ["team"])
    op.create_index("ix_runs_state", "runs", ["state"])
    op.create_index("ix_runs_exp_name", "runs", ["exp_name"])
    op.create_table(
        "events",
        sa.Column("pk", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(200), nullable=False, unique=True),
        sa.Column("run_id", sa.String(160), nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("type", sa.String(96), nullable=False),
        sa.Column("source", sa.String(128), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stream", sa.String(32), nullable=False),
        sa.Column("stream_seq", sa.Integer(), nullable=False),
        sa.Column("ingested_at", sa.Float(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
    )
    op.create_index("ix_events_run_id", "events", ["run_id"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("runs")
