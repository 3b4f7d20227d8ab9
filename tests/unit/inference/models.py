"""In-process models for the local adapter's tests: steerable, and counting what they were asked."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any


class Doubler:
    """``risk`` = amount / 1000 (the mock's rule), counting calls and the most that ran at once."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.calls = 0
        self.running = 0
        self.most_at_once = 0
        self.entered = threading.Event()
        self._lock = threading.Lock()

    def predict_batch(self, instances: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
        with self._lock:
            self.calls += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.entered.set()
        try:
            if self.gate is not None:
                self.gate.wait(timeout=30)
            return [{"risk": min(1.0, float(i["amount"]) / 1000)} for i in instances]
        finally:
            with self._lock:
                self.running -= 1


def load_doubler() -> Doubler:
    return Doubler()


def load_nothing() -> Doubler:
    raise FileNotFoundError("fraud-v3.bin")
