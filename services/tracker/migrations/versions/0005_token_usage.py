"""Generated tokens summed per run and hour (usage over a window reads these, not every trial), counted from the
trials already stored.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    usage = op.create_table(
        "token_usage",
        sa.Column("run_id", sa.String(160), primary_key=True),
        sa.Column("hour", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("tokens_generated", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_token_usage_team", "token_usage", ["team"])
    trials = sa.table(
        "trials", sa.column("run_id", sa.String()), sa.column("time", sa.DateTime(timezone=True)),
        sa.column("tokens", sa.JSON()),
    )  # fmt: skip
    runs = sa.table("runs", sa.column("run_id", sa.String()), sa.column("team", sa.String()))
    sums: dict[tuple[str, datetime], list[object]] = {}
    query = sa.select(trials.c.run_id, runs.c.team, trials.c.time, trials.c.tokens).join(
        runs, runs.c.run_id == trials.c.run_id
    )
    for run_id, team, time, tokens in op.get_bind().execute(query):
        time = time if time.tzinfo is not None else time.replace(tzinfo=UTC)
        hour = time.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        row = sums.setdefault((run_id, hour), [team, 0])
        row[1] = int(row[1]) + int((tokens or {}).get("completion", 0))  # type: ignore[call-overload]
    if sums:
        op.bulk_insert(
            usage,
            [
                {"run_id": run_id, "hour": hour, "team": team, "tokens_generated": generated}
                for (run_id, hour), (team, generated) in sums.items()
            ],
        )


def downgrade() -> None:
    op.drop_table("token_usage")
