"""One audit appender, run as its own process: ``python -m tests.faults.audit_writer HOME REDIS_URL WRITER N``.

Appends ``N`` events of type ``fault.write``, subject ``writer-{WRITER}``, data ``{"n": i}`` in order, plus
one event under the shared once key ``examlops:faults:once`` (written by whichever writer comes first), with
checkpoints every 50 events, then prints ``appended <count>``. Several run at once against one chain.
"""

from __future__ import annotations

import sys
from pathlib import Path

from examlops.bootstrap import audit_trail
from examlops.core.settings import AuditSettings, RedisSettings, Settings

ONCE_KEY = "examlops:faults:once"


def main(home: str, redis_url: str, writer: int, n: int) -> None:
    settings = Settings(home=Path(home), redis=RedisSettings(url=redis_url), audit=AuditSettings(checkpoint_every=50))
    appended = 0
    with audit_trail(settings) as trail:
        for i in range(n):
            trail.append("fault.write", f"writer-{writer}", {"n": i})
            appended += 1
            if i == n // 2:
                trail.append("fault.once", "shared", {"writer": writer}, once_key=ONCE_KEY)
    print(f"appended {appended}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
