"""The promote flow: ``promotion.service.promote``, the service `exa promote` uses, with the audit trail attached.

Moves the alias (an ``alias.move_intended`` event before it moves, ``alias.moved``
or ``alias.move_failed`` after), asks every serving instance to reload and waits
until each reports the new version. Every MLflow call is bounded by
``mlflow.timeout_s`` and ``mlflow.max_retries``. The run fails with ``PromotionIncomplete`` when an
instance does not: the alias move stays done, and the message names the instance. A model not in the
catalog, or an alias serving does not load, fails the run before anything is read or written; an alias that
already points at the version moves nothing (no registry write; every instance is still asked to serve it:
``nothing_to_do`` in the result).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from examlops.bootstrap.control import ControlPlane, audit_moves
from examlops.core.settings import Settings
from examlops.flows.wiring import artifact_key
from examlops.promotion.service import DEFAULT_TIMEOUT_S, promote


@flow(name="promote")
def promote_flow(
    model: str,
    alias: str = "Production",
    version: int | None = None,
    from_alias: str | None = None,
    instances: list[str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    actor: str = "system:promote",
) -> dict[str, Any]:
    """Point ``alias`` at ``version`` (or at what ``from_alias`` points at) and make every serving instance serve it.
    ``actor`` is the identity that triggered the run, named in the audit trail (``system:promote`` otherwise)."""
    from examlops.bootstrap.identity import platform_token

    plane = ControlPlane(Settings())
    result = promote(
        plane.settings,
        plane.registry,
        model,
        alias,
        version=version,
        from_alias=from_alias,
        catalog=plane.catalog,
        instances=instances,
        timeout_s=timeout_s,
        trail=audit_moves(plane.audit, plane.redis, actor),
        token=platform_token(plane.settings),
    )
    if result.nothing_to_do:
        get_run_logger().info("%s@%s: already at version %s, nothing moved; %d instance(s) serve it",
                              result.model, result.alias, result.new_version, len(result.instances))  # fmt: skip
        return asdict(result)
    get_run_logger().info(
        "%s@%s: %s -> %s, confirmed by %s",
        result.model, result.alias, result.old_version, result.new_version, ", ".join(result.instances),
    )  # fmt: skip
    create_table_artifact(
        key=artifact_key("promote", result.model),
        table=[{"instance": url, "serves": result.new_version} for url in result.instances],
        description=f"{result.model}@{result.alias}: {result.old_version or 'unset'} -> {result.new_version}",
    )
    return asdict(result)
