"""Ports for tests: a free one for a server a test starts, and the platform's default ports moved away.

``AWAY_FROM_THE_PLATFORM``: the environment every test runs in (``tests/conftest.py``) and every child a test
starts (``servers.examlops_env``), unless the test names its own. A test that forgets to name a Redis, a
Prefect server or serving would otherwise reach a platform `exa up` runs on this machine's default ports
(18004, 18003, 18001) and write into its audit trail; here it finds nothing listening, as on a fresh machine.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


AWAY_FROM_THE_PLATFORM = {
    "EXAMLOPS_REDIS__PORT": str(free_port()),
    "EXAMLOPS_PREFECT__PORT": str(free_port()),
    "EXAMLOPS_SERVING__PORT": str(free_port()),
}
"""Ports nothing listens on (free when the session started; a test's own server could take one later, never a
platform's), in place of the defaults."""
