"""Tables of the chain plugin: the token registry and what the indexer builds.

- ``tokens``: the token registry (slug, owner, template, chain, instance).
- ``chain_cursors``: per chain, the last indexed block (number, hash, time), the final block
  whose consumers ran, and the indexer's lease (owner, until). Written in the same
  transaction as the rows an indexed range produced.
- ``chain_blocks``: (number, hash, parent hash, time) of every indexed block not yet final,
  plus the newest final one (the anchor a reorg walks back to).
- ``chain_logs``: the raw logs of the followed contracts, keyed by (chain, block hash, log
  index), with the dpnm instance they belong to; a reorg deletes the dropped blocks' logs
  after undoing their deltas.
- ``chain_token_counters``, ``chain_positions``, ``chain_earnings``: what the indexer
  derives per token instance and per user.
- ``chain_unreadable_tokens``: the registered tokens whose instance the indexer could not
  read (not a dpnm instance: an EOA, another contract), with the reason.
- ``chain_flow_alerts``: the FLOW balance threshold a user set; ``chain_flow_alert_states``
  whether their balance on a chain is below it (so crossing below is emitted once).

Amounts are wei as exact decimal text: 18-decimal amounts overflow 64 bits, and SQLite's
NUMERIC would turn them into floats.
"""

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

metadata = MetaData()

AMOUNT_LENGTH = 78  # digits of 2^256

tokens = Table(
    "tokens", metadata,
    Column("slug", String(64), primary_key=True),
    Column("owner_address", String(42), nullable=False, index=True),
    Column("template", String(16), nullable=False),
    Column("chain_id", BigInteger, nullable=False),
    Column("instance_address", String(42), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("chain_id", "instance_address", name="uq_tokens_instance"),
)

cursors = Table(
    "chain_cursors", metadata,
    Column("chain_id", BigInteger, primary_key=True, autoincrement=False),
    Column("block_number", BigInteger, nullable=True),
    Column("block_hash", String(66), nullable=True),
    Column("block_time", BigInteger, nullable=True),
    Column("final_number", BigInteger, nullable=True),
    Column("lease_owner", String(32), nullable=True),
    Column("lease_until", DateTime(timezone=True), nullable=True),
)

blocks = Table(
    "chain_blocks", metadata,
    Column("chain_id", BigInteger, primary_key=True, autoincrement=False),
    Column("number", BigInteger, primary_key=True, autoincrement=False),
    Column("hash", String(66), nullable=False),
    Column("parent_hash", String(66), nullable=False),
    Column("time", BigInteger, nullable=False),
)

# The logs each secondary index of ``chain_logs`` holds: most logs (rewards, buys) are read
# by no query but the reorg's, by block hash (the primary key). A query served by one of them
# repeats its condition word for word (``.where(FINAL_LOGS)``): the databases use a partial
# index only for a query whose conditions imply the index's.
FINAL_EVENTS = ("Launched", "Sold")  # what runs once blocks are final, and the launches
POSITION_EVENTS = ("UserPlaced", "Activated", "ActiveUntilSet")  # a user's tree and position
FINAL_LOGS = text(f"event IN ({', '.join(repr(event) for event in FINAL_EVENTS)})")
POSITION_LOGS = text(f"event IN ({', '.join(repr(event) for event in POSITION_EVENTS)})")

logs = Table(
    "chain_logs", metadata,
    Column("chain_id", BigInteger, primary_key=True, autoincrement=False),
    Column("block_hash", String(66), primary_key=True),
    Column("log_index", Integer, primary_key=True, autoincrement=False),
    Column("block_number", BigInteger, nullable=False),
    Column("tx_hash", String(66), nullable=False),
    Column("address", String(42), nullable=False),
    Column("instance", String(42), nullable=True),
    Column("event", String(32), nullable=False),
    # The first indexed address (a user, the payer, the token's owner...), lowercase.
    Column("account", String(42), nullable=True),
    Column("topics", Text, nullable=False),
    Column("data", Text, nullable=False),
    # Partial: each index holds only the logs its reads look for (chain_0004).
    Index("ix_chain_logs_final", "chain_id", "block_number",
          sqlite_where=FINAL_LOGS, postgresql_where=FINAL_LOGS),
    Index("ix_chain_logs_position", "chain_id", "instance", "account",
          sqlite_where=POSITION_LOGS, postgresql_where=POSITION_LOGS),
)

token_counters = Table(
    "chain_token_counters", metadata,
    Column("chain_id", BigInteger, primary_key=True, autoincrement=False),
    Column("instance", String(42), primary_key=True),
    Column("tree_positions", BigInteger, nullable=False),
    Column("fees_usdt", String(AMOUNT_LENGTH), nullable=False),
    Column("gwt_minted", String(AMOUNT_LENGTH), nullable=False),
)

positions = Table(
    "chain_positions", metadata,
    Column("chain_id", BigInteger, primary_key=True, autoincrement=False),
    Column("instance", String(42), primary_key=True),
    Column("address", String(42), primary_key=True),
    Column("activated", Boolean, nullable=False),
    Column("active_until", BigInteger, nullable=False),
)

earnings = Table(
    "chain_earnings", metadata,
    Column("chain_id", BigInteger, primary_key=True, autoincrement=False),
    Column("instance", String(42), primary_key=True),
    Column("address", String(42), primary_key=True),
    Column("level", Integer, primary_key=True, autoincrement=False),
    Column("amount", String(AMOUNT_LENGTH), nullable=False),
)

unreadable_tokens = Table(
    "chain_unreadable_tokens", metadata,
    Column("chain_id", BigInteger, primary_key=True, autoincrement=False),
    Column("instance", String(42), primary_key=True),
    Column("reason", String(200), nullable=False),
    Column("checked_at", DateTime(timezone=True), nullable=False),
)

flow_alerts = Table(
    "chain_flow_alerts", metadata,
    Column("user_id", BigInteger, ForeignKey("users.id"), primary_key=True,
           autoincrement=False),
    Column("threshold", String(AMOUNT_LENGTH), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

flow_alert_states = Table(
    "chain_flow_alert_states", metadata,
    Column("user_id", BigInteger, ForeignKey("users.id"), primary_key=True,
           autoincrement=False),
    Column("chain_id", BigInteger, primary_key=True, autoincrement=False),
    Column("below", Boolean, nullable=False),
)
