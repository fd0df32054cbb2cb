"""SQLAlchemy tables of the tuning database: workloads, their tuning records, colocation profiles."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    """Declarative base with a naming convention, so migrations name constraints the same everywhere."""

    metadata = MetaData(naming_convention=NAMING)


class Workload(Base):
    """A tuning task: one IRModule, stored once per (structural hash, sha256 of its JSON)."""

    __tablename__ = "workloads"
    __table_args__ = (UniqueConstraint("shash", "mod_sha256"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    shash: Mapped[str] = mapped_column(String(40), index=True)
    mod_sha256: Mapped[str] = mapped_column(String(64))
    mod_json: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TuningRecord(Base):
    """One measured (or failed) schedule of a workload, for one target and compute-unit count."""

    __tablename__ = "tuning_records"
    __table_args__ = (
        UniqueConstraint("workload_id", "target_hash", "units", "trace_sha256"),
        Index("ix_tuning_records_lookup", "workload_id", "target_hash", "units", "mean_latency_s"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"))
    target_json: Mapped[str] = mapped_column(Text)
    target_hash: Mapped[str] = mapped_column(String(64))
    units: Mapped[int] = mapped_column(Integer)
    unit_kind: Mapped[str] = mapped_column(String(16))
    trace_json: Mapped[str] = mapped_column(Text)
    trace_sha256: Mapped[str] = mapped_column(String(64))
    run_secs_json: Mapped[str] = mapped_column(Text)
    mean_latency_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    blocks: Mapped[int | None] = mapped_column(Integer, nullable=True)
    args_info_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    tool_version: Mapped[str] = mapped_column(String(32))


class Colocation(Base):
    """Interference of candidate kernel `first` while `second` runs beside it (tvmsched profile-coloc)."""

    __tablename__ = "colocation"
    __table_args__ = (Index("ix_colocation_device", "device"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device: Mapped[str] = mapped_column(String(128))
    first: Mapped[str] = mapped_column(Text)  # "<model>/<kernel symbol>"
    second: Mapped[str] = mapped_column(Text)
    isolated_us: Mapped[float] = mapped_column(Float)
    colocated_us: Mapped[float] = mapped_column(Float)
    overhead: Mapped[float] = mapped_column(Float)  # per unit time: (colocated - isolated) / overlap
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
