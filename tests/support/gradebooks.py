"""A gradebook read whole, for tests that compare one before and after."""

from __future__ import annotations


def table_dump(workdir) -> dict[str, list[tuple]]:
    """Every row of every table of the work folder's gradebook, sorted."""
    return gradebook_dump(f"sqlite:///{workdir / 'gradebook.db'}")


def gradebook_dump(url: str) -> dict[str, list[tuple]]:
    """Every row of every table of the gradebook at ``url`` (SQLite or PostgreSQL), sorted."""
    from sqlalchemy import MetaData, create_engine, select

    engine = create_engine(url)
    try:
        tables = MetaData()
        tables.reflect(engine)
        with engine.connect() as db:
            return {
                name: sorted((tuple(row) for row in db.execute(select(table))), key=repr)
                for name, table in tables.tables.items()
            }
    finally:
        engine.dispose()
