"""keys: the usage log partitioned by day on PostgreSQL, and per-key usage rollups

On PostgreSQL ``api_key_usage`` becomes a table ``PARTITION BY RANGE (at)`` with a
``api_key_usage_default`` partition: every existing row is copied into the default
partition here, and the core's retention actor spreads them into day partitions as it
creates those (``runtime.retention``). Its primary key becomes (id, at); ids keep coming
from the same sequence. SQLite keeps its plain table.

``api_key_usage_rollups`` is filled from the rows already logged, at the three widths
(minute, hour, day) the keys plugin keeps (``plugins.keys.rollups``).

Revision ID: keys_0004
Revises: keys_0003
"""

import sqlalchemy as sa
from alembic import op

revision = "keys_0004"
down_revision = "keys_0003"
branch_labels = None
depends_on = None

COLUMNS = "id, key_id, at, kind, method, route, status, cost, model, latency_us, request_id"
INDEXES = {"ix_api_key_usage_key_id_at": "key_id, at", "ix_api_key_usage_at": "at",
           "ix_api_key_usage_request_id": "request_id"}
OUTCOME = ("CASE WHEN status IS NULL THEN 'none' WHEN status < 400 THEN 'ok' "
           "WHEN status = 402 THEN '402' WHEN status = 429 THEN '429' "
           "WHEN status < 500 THEN '4xx' ELSE '5xx' END")


def _swap_usage_table(*definition: str) -> None:
    """Replace ``api_key_usage`` by a table made by the statements ``definition``, holding
    its rows (the ids' sequence goes with it)."""
    op.execute("ALTER TABLE api_key_usage RENAME TO api_key_usage_old")
    op.execute("ALTER SEQUENCE api_key_usage_id_seq OWNED BY NONE")
    op.execute("ALTER TABLE api_key_usage_old RENAME CONSTRAINT api_key_usage_pkey "
               "TO api_key_usage_old_pkey")
    for name in INDEXES:
        op.execute(f"DROP INDEX {name}")
    for statement in definition:
        op.execute(statement)
    op.execute("ALTER SEQUENCE api_key_usage_id_seq OWNED BY api_key_usage.id")
    op.execute(f"INSERT INTO api_key_usage ({COLUMNS}) SELECT {COLUMNS} FROM api_key_usage_old")
    op.execute("DROP TABLE api_key_usage_old")
    for name, columns in INDEXES.items():
        op.execute(f"CREATE INDEX {name} ON api_key_usage ({columns})")


def _usage_table(primary_key: str, partitioning: str) -> str:
    return (
        "CREATE TABLE api_key_usage ("
        "id BIGINT NOT NULL DEFAULT nextval('api_key_usage_id_seq'), "
        "key_id BIGINT NOT NULL REFERENCES api_keys (id), at TIMESTAMPTZ NOT NULL, "
        "kind VARCHAR(8) NOT NULL, method VARCHAR(8), route VARCHAR(255), status INTEGER, "
        "cost BIGINT NOT NULL, model VARCHAR(64), latency_us BIGINT, "
        f"request_id VARCHAR(128), CONSTRAINT api_key_usage_pkey PRIMARY KEY ({primary_key})"
        f"){partitioning}")


def _bucket(dialect: str, seconds: int) -> str:
    if dialect == "postgresql":
        return f"to_timestamp(floor(extract(epoch FROM at) / {seconds}) * {seconds})"
    # SQLite stores times as 'YYYY-MM-DD HH:MM:SS.ffffff' text, compared as text.
    return (f"strftime('%Y-%m-%d %H:%M:%S.000000', "
            f"(CAST(strftime('%s', at) AS INTEGER) / {seconds}) * {seconds}, 'unixepoch')")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        _swap_usage_table(
            _usage_table("id, at", " PARTITION BY RANGE (at)"),
            "CREATE TABLE api_key_usage_default PARTITION OF api_key_usage DEFAULT")
    op.create_table(
        "api_key_usage_rollups",
        sa.Column("key_id", sa.BigInteger(), sa.ForeignKey("api_keys.id"), primary_key=True),
        sa.Column("bucket_seconds", sa.Integer(), primary_key=True),
        sa.Column("bucket_start", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("model", sa.String(64), primary_key=True),
        sa.Column("outcome", sa.String(4), primary_key=True),
        sa.Column("calls", sa.BigInteger(), nullable=False),
        sa.Column("cost", sa.BigInteger(), nullable=False),
        sa.Column("latency_us", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_api_key_usage_rollups_bucket_start", "api_key_usage_rollups",
                    ["bucket_start"])
    for seconds in (60, 3600, 86400):
        op.execute(
            "INSERT INTO api_key_usage_rollups (key_id, bucket_seconds, bucket_start, kind, "
            "model, outcome, calls, cost, latency_us) "
            f"SELECT key_id, {seconds}, {_bucket(dialect, seconds)}, kind, "
            f"COALESCE(model, 'unknown'), {OUTCOME}, count(*), sum(cost), "
            "COALESCE(sum(latency_us), 0) FROM api_key_usage GROUP BY 1, 3, 4, 5, 6")


def downgrade() -> None:
    op.drop_table("api_key_usage_rollups")
    if op.get_bind().dialect.name == "postgresql":
        _swap_usage_table(_usage_table("id", ""))
