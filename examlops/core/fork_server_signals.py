"""Imported by a warm fork server alone (``children.warm_context`` preloads it; nothing else may import it):
the server, and every child it forks, ignore SIGTERM.

A SIGTERM to every process of serving (``kill -TERM -PGID``; systemd's default stop signals the whole
cgroup) would otherwise end the fork server and the predict workers while serving drains: the calls in
flight would fail and the pool would break. The parent owns shutdown: it closes its workers' pipes (a worker
exits on EOF) and stops the server (``children.stop_warm_server``); a child whose parent died still exits
within ``children.PARENT_CHECK_S``, and the server once its parent and its children are gone.
"""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
