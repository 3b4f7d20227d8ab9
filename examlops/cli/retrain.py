"""`exa retrain`: train a candidate now, in this process, or start a run of the retrain deployment.

Thin: parse, call ``examlops.flows.retrain`` (through ``examlops.bootstrap.control``) or Prefect's
``run_deployment``, format. Heavy imports happen inside the command; a Prefect that does not start the
run exits with code 3. Either way the model and the alias are checked first (exit 4, exit 2).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from examlops.cli.output import JsonOption, console, errors_as_exit, load_settings, print_json
from examlops.core.settings import Settings


def retrain(
    model: Annotated[str, typer.Argument(help="Catalog model name (any case).")],
    alias: Annotated[str, typer.Option("--alias", help="The candidate alias: Canary or Staging.")] = "Canary",
    shift: Annotated[float, typer.Option("--shift", min=0.0, help="Train on synthetic data moved this far.")] = 0.0,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the fresh data; default: random.")] = None,
    via_prefect: Annotated[
        bool, typer.Option("--via-prefect", help="Start a run of the retrain deployment instead (needs `exa up`).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Train a candidate on fresh data and compare it with Production on held-out rows; a better one goes to
    Canary (a worse one is registered but never served). Refused while a loop holds the model. Through
    Prefect (--via-prefect), a candidate on Canary then gets its canary analysis. A model not in the catalog
    (exit 4) or an alias other than Canary or Staging (exit 2) is refused before anything starts, and the
    model's loop state stays as it was."""
    from examlops.bootstrap.identity import acting_identity
    from examlops.identity import Permission

    settings = load_settings()
    with errors_as_exit():
        actor = acting_identity(settings, Permission.RETRAIN)
    if via_prefect:
        _retrain_via_prefect(settings, model, alias, shift, seed, as_json, actor)
        return
    import uuid
    from dataclasses import asdict

    from examlops.bootstrap.control import ControlPlane
    from examlops.bootstrap.loop import closed_loop
    from examlops.flows.retrain import prepare_retrain
    from examlops.loop.cycle import retrain_cycle
    from examlops.registry.retrain import RetrainResult

    plane = ControlPlane(settings)
    with errors_as_exit(), console.status(f"retraining {model}") as status:
        name = plane.catalog.get(model).name
        train = prepare_retrain(plane, name, reason="exa retrain", candidate_alias=alias, data_shift=shift, seed=seed,
                                on_progress=status.update, actor=actor)  # fmt: skip
        with closed_loop(settings, actor=actor, say=status.update) as parts:
            owner = f"cli-retrain-{uuid.uuid4().hex[:12]}"
            cycle = retrain_cycle(parts, name, owner=owner, run=f"exa retrain by {actor}", from_trigger=False,
                                  retrain=train, analyse=None, reason="exa retrain")  # fmt: skip
    result = cycle.candidate
    assert isinstance(result, RetrainResult)
    if as_json:
        print_json({**asdict(result), "better": result.better, "loop": cycle.note})
        return
    if result.production_error:
        prod = result.production_error
    elif result.production_rmse is None:
        prod = "no Production version"
    else:
        prod = f"Production (version {result.production_version}) RMSE {result.production_rmse:.4f}"
    moved = (
        f"{result.alias} {result.replaced_version or '(unset)'} -> {result.version}"
        if result.moved
        else f"not better than Production: {result.alias} not moved"
    )
    console.print(
        f"{result.model}: version {result.version} registered (run {result.run_id}); {moved}\n"
        f"held-out RMSE {result.candidate_rmse:.4f} vs {prod}\n{cycle.note}",
        highlight=False,
    )


def _retrain_via_prefect(
    settings: Settings, model: str, alias: str, shift: float, seed: int | None, as_json: bool, actor: str
) -> None:
    from examlops.bootstrap import catalog
    from examlops.bootstrap.loop import refuse_if_held
    from examlops.cli.deployments import start_run
    from examlops.registry.retrain import checked_candidate_alias

    with errors_as_exit():  # the flow would refuse them too, but in Prefect, out of the operator's sight
        name = catalog(settings).get(model).name
        alias = checked_candidate_alias(alias)
        refuse_if_held(settings, name)
    parameters: dict[str, Any] = {"model": name, "reason": "exa retrain", "candidate_alias": alias}
    parameters |= {"data_shift": shift, "seed": seed, "actor": actor, "source": "operator"}
    start_run(settings, "retrain/retrain", parameters, what=f"retrain of {name}", as_json=as_json)
