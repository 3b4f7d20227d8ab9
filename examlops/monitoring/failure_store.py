"""The failure windows, cooldowns and retrain claims in Redis: ``RedisFailureStore``, the ``FailureStore`` adapter.

The window and the cooldown live in Redis, shared by every bridge, so "the last 50 requests of a model"
means all of its bus requests whichever bridge served them, every tracker sees the same rate, and
``exa bridge status`` can read it from another process. Keys (``{model}`` lower-cased)::

    examlops:failures:window:{model}     list of "1" (failure) / "0", the last ``window`` outcomes
    examlops:failures:cooldown:{model}   the idempotency key of the last request; expires after the cooldown
    examlops:failures:models             set of the model names with a window

Contracts: each push is one script (``push_many``: one script per batch, remembered under its call key
so a retried call counts nothing twice). ``claim`` is one script: ``SET cooldown NX PX`` and, only if
that set it, the request into the retrain outbox; however many trackers cross the threshold together,
one of them sets the key, so one request is made per cooldown.

Failure mode: ``StoreUnavailable`` when Redis cannot be reached.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from examlops.adapters.redis import translated
from examlops.monitoring.failures import WindowState
from examlops.monitoring.retrain import LAST, OUTBOX, RetrainRequest, last_record

WINDOW_PREFIX = "examlops:failures:window:"
COOLDOWN_PREFIX = "examlops:failures:cooldown:"
MODELS = "examlops:failures:models"


PUSH_SCRIPT = """
-- KEYS: window list, models set. ARGV: '1' or '0', capacity, model name. Returns {size, failures}.
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('SADD', KEYS[2], ARGV[3])
local failures = 0
for _, v in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  if v == '1' then failures = failures + 1 end
end
return {redis.call('LLEN', KEYS[1]), failures}
"""

PUSH_MANY_SCRIPT = """
-- KEYS: models set, then one window list per model. ARGV: capacity, call key ('' = none), its TTL (ms), then
-- per window: name count k, the k names pushed to it, its outcomes ('1'/'0' per push, in order). Same effect
-- as PUSH_SCRIPT once per outcome; returns {size, failures} after each push, flat, window by window. Each
-- window is read once (no LRANGE per push). The call key keeps that answer: a call that finds it (the call
-- ran before, its answer was lost) pushes nothing and gets the same answer again.
local cap, out, a = tonumber(ARGV[1]), {}, 4
if ARGV[2] ~= '' then
  local saved = redis.call('GET', ARGV[2])
  if saved then
    for v in string.gmatch(saved, '[^,]+') do out[#out + 1] = tonumber(v) end
    return out
  end
end
for m = 2, #KEYS do
  local key, k = KEYS[m], tonumber(ARGV[a])
  redis.call('SADD', KEYS[1], unpack(ARGV, a + 1, a + k))
  local bits = ARGV[a + k + 1]
  a = a + k + 2
  local q = redis.call('LRANGE', key, 0, -1)
  local head, tail, failures = 1, #q, 0
  for _, v in ipairs(q) do if v == '1' then failures = failures + 1 end end
  local pushed = {}
  for i = 1, #bits do
    local b = string.sub(bits, i, i)
    pushed[i] = b
    tail = tail + 1
    q[tail] = b
    if b == '1' then failures = failures + 1 end
    while tail - head + 1 > cap do
      if q[head] == '1' then failures = failures - 1 end
      q[head] = nil
      head = head + 1
    end
    out[#out + 1] = tail - head + 1
    out[#out + 1] = failures
  end
  for i = 1, #pushed, 1000 do
    redis.call('RPUSH', key, unpack(pushed, i, math.min(i + 999, #pushed)))
  end
  redis.call('LTRIM', key, -cap, -1)
end
if ARGV[2] ~= '' then redis.call('SET', ARGV[2], table.concat(out, ','), 'PX', ARGV[3]) end
return out
"""

CLAIM_SCRIPT = """
-- KEYS: cooldown key, outbox hash, last-request hash. ARGV: idempotency key, cooldown ms, request, last, model.
-- The last-request hash is keyed by the lower-cased model name.
if tonumber(ARGV[2]) > 0 and not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[5], ARGV[4])
return 1
"""


CALL_KEY_TTL_MS = 4_200_000
"""How long a ``push_many`` call key is remembered: far longer than any retry of the call."""


class RedisFailureStore:
    """Windows, cooldowns and retrain claims in Redis; ``StoreUnavailable`` when Redis is down."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._push = client.register_script(PUSH_SCRIPT)
        self._push_many = client.register_script(PUSH_MANY_SCRIPT)
        self._claim = client.register_script(CLAIM_SCRIPT)

    def push(self, model: str, failed: bool, capacity: int) -> WindowState:
        with translated("updating a failure window"):
            reply: Any = self._push(
                keys=[WINDOW_PREFIX + model.lower(), MODELS], args=["1" if failed else "0", capacity, model]
            )
        return WindowState(int(reply[0]), int(reply[1]), capacity)

    def push_many(
        self, outcomes: Sequence[tuple[str, bool]], capacity: int, *, call_key: str = ""
    ) -> list[WindowState]:
        """One script for a whole batch: the outcomes grouped by window, each group in its order."""
        if not outcomes:
            return []
        groups: dict[str, tuple[dict[str, None], list[int]]] = {}  # window key -> (its names, positions)
        for position, (model, _failed) in enumerate(outcomes):
            names, positions = groups.setdefault(WINDOW_PREFIX + model.lower(), ({}, []))
            names[model] = None
            positions.append(position)
        keys = [MODELS, *groups]
        args: list[str | int] = [capacity, call_key, CALL_KEY_TTL_MS]
        for names, positions in groups.values():
            args += [len(names), *names, "".join("1" if outcomes[p][1] else "0" for p in positions)]
        with translated("updating failure windows"):
            reply: Any = self._push_many(keys=keys, args=args)  # its call key makes a resend safe
        states: list[WindowState] = [WindowState(0, 0, capacity)] * len(outcomes)
        at = 0
        for _names, positions in groups.values():
            for position in positions:
                states[position] = WindowState(int(reply[at]), int(reply[at + 1]), capacity)
                at += 2
        return states

    def claim(self, model: str, cooldown_s: float, request: RetrainRequest) -> bool:
        keys = [COOLDOWN_PREFIX + model.lower(), OUTBOX, LAST]
        last = json.dumps(last_record(request))
        args: list[str | int] = [request.idempotency_key, int(cooldown_s * 1000), request.to_json(), last]
        args.append(model.lower())
        with translated("claiming a retrain"):
            return bool(self._claim(keys=keys, args=args))

    def reset(self, model: str, *, cooldown: bool) -> None:
        """Empty the model's window, and with ``cooldown`` end its retrain cooldown (the closed loop, once it
        has put a new version in Production)."""
        keys = [WINDOW_PREFIX + model.lower(), *([COOLDOWN_PREFIX + model.lower()] if cooldown else [])]
        with translated("resetting a failure window"):
            self.redis.delete(*keys)

    def window(self, model: str, capacity: int) -> WindowState:
        with translated("reading a failure window"):
            items: Any = self.redis.lrange(WINDOW_PREFIX + model.lower(), -capacity, -1)
        return WindowState(len(items), sum(1 for item in items if item == "1"), capacity)

    def cooldown_left(self, model: str) -> float:
        with translated("reading a cooldown"):
            left: Any = self.redis.pttl(COOLDOWN_PREFIX + model.lower())
        return max(0, int(left)) / 1000

    def models(self) -> list[str]:
        with translated("listing failure windows"):
            found: Any = self.redis.smembers(MODELS)
        return sorted(str(m) for m in found)

    def last_requests(self) -> dict[str, dict[str, Any]]:
        with translated("reading retrain requests"):
            raw: Any = self.redis.hgetall(LAST)
        return {model: json.loads(text) for model, text in raw.items()}
