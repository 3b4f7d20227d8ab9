"""The HTTP permission matrix under fuzzing: hypothesis draws identity x token state x route at a running
serving (`exa serve start`, the demo models, real SQL identities).

Token states: none, another scheme, malformed (random text after ``exa_``), forged (well formed, a key id
no identity has), a known key id with a wrong secret, revoked, and valid: the identity's own token, which
then meets routes outside its permissions (a caller narrowed to one model calling another, one narrowed to
a task calling another task or a model route, a caller on control routes). The documented status is
computed from the identity's role, models and tasks (``identity/README.md``) and must be what serving
answers. Must hold, for every example:

- a bad token of any kind: 401 ``unauthenticated`` with ``WWW-Authenticate: Bearer``, one body for all;
- a valid token outside its permissions: 403 ``forbidden`` naming the permission; inside: not refused;
- a refused call serves nothing (the requests counter of ``/metrics`` does not move);
- no presented token (nor its secret) in any reply, and, after the run, none in serving's log.

``tests/integration/test_auth_http.py`` holds the fixed matrix; this draws its combinations at random.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.conftest import LONG
from tests.integration.servers import ServingProcess
from tests.integration.test_auth_http import INFER, PREDICT, V2, _cli, served_requests

pytestmark = [
    pytest.mark.timeout(900 if LONG else 300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning"),
]

EXAMPLES = 400 if LONG else 60
JPCP_TASK, AC_TASK = "pavement.distress.jpcp", "pavement.distress.ac"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    body: Any
    permission: str | None
    """What the route needs beyond a valid token (None: any identity)."""
    model: str | None = None
    """The model it calls (a task's: the one the task maps to)."""
    task: str | None = None

    @property
    def calls(self) -> bool:
        return self.permission == "call"


ROUTES = [
    Route("POST", "/infer-pipeline/infer", INFER, "call", model="jpcp"),
    Route("POST", "/infer-pipeline/infer", {**INFER, "model": "AC"}, "call", model="ac"),
    Route("POST", "/v1/models/JPCP/predict", PREDICT, "call", model="jpcp"),
    Route("POST", "/v1/models/AC/predict", PREDICT, "call", model="ac"),
    Route("POST", "/v2/models/JPCP/infer", V2, "call", model="jpcp"),
    Route("POST", "/v2/models/AC/infer", V2, "call", model="ac"),
    Route("POST", f"/v1/tasks/{JPCP_TASK}/infer", PREDICT, "call", model="jpcp", task=JPCP_TASK),
    Route("POST", f"/v1/tasks/{AC_TASK}/infer", PREDICT, "call", model="ac", task=AC_TASK),
    Route("GET", "/v1/models", None, None),
    Route("GET", "/v1/traffic/JPCP", None, None),
    Route("PUT", "/v1/traffic/JPCP", {}, "set_traffic"),
    Route("POST", "/admin/reload", {"model": "JPCP"}, "reload"),
    Route("GET", "/v1/traces", None, "read_traces"),
    Route("GET", f"/v1/traces/{'0' * 32}", None, "read_traces"),
]


@dataclass(frozen=True)
class Who:
    role: str
    models: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()

    def lacks(self, route: Route) -> str | None:
        """The permission a valid token of this identity lacks for ``route`` (None: allowed)."""
        if route.permission is None:
            return None
        if self.role == "caller" and route.permission != "call":
            return route.permission
        if route.calls:
            if self.models and route.model not in self.models:
                return "call"  # the model (or the task's model) is outside its models
            if route.task is None and self.tasks and not self.models:
                return "call"  # narrowed to tasks: calls by task only
            if route.task is not None and self.tasks and route.task not in self.tasks:
                return "call"
        return None


IDENTITIES = {
    "robot": Who("caller", models=("jpcp",)),
    "tasker": Who("caller", tasks=(JPCP_TASK,)),
    "console": Who("operator"),
    "admin": Who("admin"),
}
STATES = ["none", "basic", "malformed", "forged", "wrong_secret", "revoked", "valid"]


@dataclass(frozen=True)
class Platform:
    server: ServingProcess
    tokens: dict[str, str]
    presented: set[str]
    """Every token string sent during the run (checked against the log at the end)."""


@pytest.fixture(scope="module")
def platform(hostile_serving: ServingProcess) -> Platform:
    """The session's hostile serving (``conftest.hostile_serving``, shared with ``test_hostile_http.py``), with
    this module's identities added."""
    server = hostile_serving
    cli_env = {"EXAMLOPS_HOME": str(server.home), "EXAMLOPS_TOKEN": server.token}
    tokens = {"admin": server.token}
    for name, role, extra in (
        ("robot", "caller", ["--model", "jpcp"]),
        ("tasker", "caller", ["--task", JPCP_TASK]),
        ("console", "operator", []),
        ("gone", "caller", []),
    ):
        tokens[name] = _cli(cli_env, "identity", "add", name, "--role", role, *extra)["token"]
    _cli(cli_env, "identity", "revoke", "gone")
    return Platform(server, tokens, set())


def credentials(platform: Platform, who: str, state: str, noise: str) -> dict[str, str]:
    own = platform.tokens[who]
    key_id = own.split("_")[1]
    token = {
        "none": "",
        "basic": own,
        "malformed": f"exa_{noise}",
        "forged": f"exa_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}",
        "wrong_secret": f"exa_{key_id}_{secrets.token_urlsafe(32)}",
        "revoked": platform.tokens["gone"],
        "valid": own,
    }[state]
    if not token:
        return {}
    platform.presented.add(token)
    scheme = "Basic" if state == "basic" else "Bearer"
    return {"Authorization": f"{scheme} {token}"}


def revealing(presented: str) -> str:
    """What of a presented token must never be shown: its secret (of a well-formed one), else the whole of a
    long enough one; "" for a scrap too short to tell from text that happens to hold it."""
    token = presented.split(" ", 1)[-1]
    parts = token.split("_", 2)
    if len(parts) == 3 and len(parts[2]) >= 20:
        return parts[2]
    return token if len(token) >= 16 else ""


def test_every_drawn_identity_token_and_route_gets_the_documented_status_and_serves_nothing_refused(
    platform: Platform,
) -> None:
    unauthenticated: set[str] = set()
    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=not LONG)
    @given(
        who=st.sampled_from(sorted(IDENTITIES)),
        state=st.sampled_from(STATES),
        route=st.sampled_from(ROUTES),
        noise=st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=60),
    )
    def one(who: str, state: str, route: Route, noise: str) -> None:
        headers = credentials(platform, who, state, noise)
        lacks = IDENTITIES[who].lacks(route) if state == "valid" else "token"
        before = served_requests(platform.server) if lacks else 0.0
        reply = httpx.request(
            route.method, f"{platform.server.url}{route.path}", json=route.body, headers=headers, timeout=30
        )
        shown = reply.text + "".join(f"{k}: {v}" for k, v in reply.headers.items())
        leaked = [t for t in map(revealing, headers.values()) if t and t in shown]
        assert leaked == [], (who, state, route.path)
        context = (who, state, route.method, route.path, reply.status_code, reply.text[:300])
        seen[f"{state}:{reply.status_code}"] += 1
        if lacks == "token":
            assert reply.status_code == 401, context
            assert reply.headers.get("www-authenticate") == "Bearer", context
            assert reply.json()["code"] == "unauthenticated", context
            unauthenticated.add(reply.text if not route.path.startswith("/v2") else "v2:" + reply.text)
        elif lacks is not None:
            assert reply.status_code == 403, context
            data = reply.json()
            assert data["code"] == "forbidden" and data["inference_failed"] is False, context
            assert lacks in data["error"], context
        else:
            assert reply.status_code not in (401, 403), context
            assert reply.status_code < 500, context
        if lacks:
            assert served_requests(platform.server) == before, context

    one()
    print(
        json.dumps({"scenario": "permission matrix under fuzzing", "long": LONG, "answers": dict(sorted(seen.items()))})
    )
    # One body for every bad token (one per error format: the V2 routes answer in the protocol's).
    assert len({b for b in unauthenticated if not b.startswith("v2:")}) <= 1
    assert len({b for b in unauthenticated if b.startswith("v2:")}) <= 1
    log = platform.server.log_path.read_text(errors="replace")
    assert [t for t in map(revealing, platform.presented) if t and t in log] == []
