"""Pass counts per run and task, kept as trials arrive (a long run's task grid without scanning its trials).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_stats",
        sa.Column("run_id", sa.String(160), primary_key=True),
        sa.Column("task", sa.String(256), primary_key=True),
        sa.Column("num_trials", sa.Integer(), nullable=False),
        sa.Column("num_scored", sa.Integer(), nullable=False),
        sa.Column("passes", sa.Integer(), nullable=False),
        sa.Column("reward_sum", sa.Float(), nullable=False),
    )
    # The trials already stored, counted once.
    op.execute(
        """
        INSERT INTO task_stats (run_id, task, num_trials, num_scored, passes, reward_sum)
        SELECT run_id, task, count(*), count(reward), sum(CASE WHEN reward >= 1.0 THEN 1 ELSE 0 END),
               coalesce(sum(reward), 0.0)
        FROM trials GROUP BY run_id, task
        """
    )


def downgrade() -> None:
    op.drop_table("task_stats")
