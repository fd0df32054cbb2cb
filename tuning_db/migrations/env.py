"""Alembic environment of the tuning database.

`SQLStore` runs it programmatically with an open connection in `config.attributes["connection"]`;
the `alembic` CLI also works with `-x url=...` or `sqlalchemy.url` set in its ini file.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from tvmsched.tuning_db.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    """The database URL for CLI runs."""
    return context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")


def _run(connection) -> None:
    """Run the migrations on an open connection."""
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Migrate through the caller's connection, or one opened from the URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(_url())
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


def run_offline() -> None:
    """Emit the SQL without a database."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
