"""The endpoint without Spark: settings in, dialect SQL on DB-API connections (ARCHITECTURE.md).

Its public name for programs and jobs: `create_queues` (the idempotent installer, as
``sqlqueue create-queue`` runs it). The rest is the connector's own.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_queues"]


def __getattr__(name: str) -> Any:
    # loaded on first use: importing one room of the transport does not import the installers
    if name == "create_queues":
        from .operations.install import create_queues

        return create_queues
    raise AttributeError(f"module 'spark_qtransport.transport' has no attribute {name!r}")
