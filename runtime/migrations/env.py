"""Alembic environment: runs on the connection flowsvc hands over (see runtime.migrate)."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
