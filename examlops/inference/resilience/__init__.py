"""Resilience policies for the inference port: retry, hedging, shedding by criticality, a circuit breaker.

``ResilientAdapter(inner, Policy(...))`` wraps any adapter and is one itself, so wiring binds one policy to
every route and the port does not change. A prediction is a pure read, which is what makes retrying and
hedging it safe; a stream gets the breaker only, since a partly consumed stream cannot be replayed.
"""

from examlops.inference.resilience.adapter import ResilientAdapter, RouteGuard
from examlops.inference.resilience.breaker import CIRCUIT_OPEN, CircuitBreaker, State
from examlops.inference.resilience.policy import BreakerPolicy, HedgePolicy, Policy, RetryPolicy, SheddingPolicy
from examlops.inference.resilience.shedding import SHED

__all__ = [
    "CIRCUIT_OPEN",
    "SHED",
    "BreakerPolicy",
    "CircuitBreaker",
    "HedgePolicy",
    "Policy",
    "ResilientAdapter",
    "RetryPolicy",
    "RouteGuard",
    "SheddingPolicy",
    "State",
]
