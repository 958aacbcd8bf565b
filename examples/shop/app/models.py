"""The shop's own tables: orders, and the effects its job handlers write (exactly once each)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import BigInteger, CheckConstraint, DateTime, Integer, Numeric, Text, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """The shop's declarative base (its alembic history builds these tables)."""


class Order(Base):
    """An order; its confirmation job is enqueued in the same transaction."""

    __tablename__ = "orders"
    __table_args__ = (CheckConstraint("amount >= 0", name="orders_amount_check"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    customer: Mapped[str] = mapped_column(Text)
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Effect(Base):
    """What a handler did for a job: one row per job (the primary key makes a second run visible)."""

    __tablename__ = "shop_effects"

    tag: Mapped[str] = mapped_column(Text, primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger)
    queue: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer)
    written_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
