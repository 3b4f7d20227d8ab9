"""The audit events of the closed loop: each names the model, the versions and the figures that decided."""

from __future__ import annotations

CANARY_STARTED = "loop.canary_started"
"""An analysis set the split: ``data`` has the versions, the share, the gates' limits and the run."""
DECIDED = "loop.decided"
"""An analysis ended: ``data`` has the decision (pass, fail, undecided, aborted), every gate with its figures
and limit, each version's figures, what was done (promoted, Canary's share set to 0, split restored)."""
ROLLED_BACK = "loop.rolled_back"
"""The failure trigger fired within the grace period of the loop's promotion: Production went back."""
TRIGGER_DROPPED = "loop.trigger_dropped"
"""A retrain was asked for while a loop held the model: nothing was started, and this says which loop."""
CANDIDATE_KEPT_BACK = "loop.candidate_kept_back"
"""A retrained candidate was not better than Production on its own evaluation: Canary was not moved."""
