"""Imported by a warm fork server alone (``children.warm_context`` preloads it; nothing else may import it):
the server, and every child it forks, ignore SIGTERM.

A SIGTERM to serving's whole process group (systemd's default stop, ``kill -TERM -PGID``) would otherwise
end the fork server and the predict workers while serving drains: the calls in flight would fail and the
pool would break. The parent owns shutdown: it closes its workers' pipes (a worker exits on EOF) and stops
the server (``children.stop_warm_server``); a child whose parent died still exits within
``children.PARENT_CHECK_S``, and the server when its parent has.
"""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
