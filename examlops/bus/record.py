"""The record of a served bus job (``core.records.ServedInference``), written with its reply by ``jobs``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from examlops.bus import wire
from examlops.core.records import ServedInference, embedding_stats


def packed_record(
    job: wire.Job, model: str, caller: str, body: Mapping[str, Any], status: int, served_at: float
) -> str:
    """The job's record (``ServedInference.packed``) with its embedding's statistics: zeros for an input serving
    refused as invalid, or an embedding that is not a list of numbers."""
    embedding, nodes = job.payload.get("embedding"), job.payload.get("node_count")
    valid = body.get("code") != "invalid_input" and isinstance(embedding, list)
    try:
        norm, mean, std = embedding_stats(embedding) if valid else (0.0, 0.0, 0.0)  # type: ignore[arg-type]  # a list, checked above
    except TypeError:  # an embedding serving answered with an error, holding non-numbers
        norm, mean, std = 0.0, 0.0, 0.0
    served = ServedInference(
        job_id=job.job_id,
        address=job.address,
        model=model,
        caller=caller,
        node_count=nodes if valid and type(nodes) is int else 0,
        reply=body,
        status=status,
        served_at=served_at,
        norm=norm,
        mean=mean,
        std=std,
    )
    return served.packed()
