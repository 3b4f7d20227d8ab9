"""A child's output into a size-rotated log file: ``LogPump``.

A child whose stdout is a redirected file cannot have that file rotated: it keeps writing through its
descriptor to the renamed file, whatever logrotate or a handler does to the name. So children write to a
pipe, and a thread of the process that started them copies the pipe, line by line, into a
``logging.handlers.RotatingFileHandler``: past ``max_bytes`` the file becomes ``.1`` (``.1`` becomes
``.2`` ..., up to ``backups``, the oldest deleted). The same works for programs we do not control
(redis-server, mlflow, prefect) and for every process of the child's group, which share the pipe.

A line longer than 64 KiB is written in pieces. When the starting process dies, the pipe breaks: the
children lose their log (they are stopped by ``exa down``, which signals their groups).
"""

from __future__ import annotations

import logging
import logging.handlers
import threading
from pathlib import Path
from typing import IO

MAX_LINE = 65536


def rotating_handler(path: Path, *, max_bytes: int, backups: int) -> logging.handlers.RotatingFileHandler:
    """A handler that writes each record's message as it is (no newline of its own), rotated by size.

    A log left by an earlier run is rotated away first, so each run starts a fresh file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists() and path.stat().st_size > 0
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    handler.terminator = ""
    handler.setFormatter(logging.Formatter("%(message)s"))
    if existed:
        handler.doRollover()
    return handler


class LogPump:
    """Copies ``pipe`` into ``path`` with rotation, on a daemon thread, until the pipe's end of file."""

    def __init__(self, pipe: IO[bytes], path: Path, *, max_bytes: int, backups: int) -> None:
        self._pipe = pipe
        self._handler = rotating_handler(path, max_bytes=max_bytes, backups=backups)
        self._thread = threading.Thread(target=self._run, name=f"log-pump-{path.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while line := self._pipe.readline(MAX_LINE):
                text = line.decode("utf-8", "replace")
                self._handler.emit(logging.makeLogRecord({"msg": text, "args": None}))
        except (OSError, ValueError):  # the pipe was closed under us
            pass
        finally:
            self._handler.close()
            self._pipe.close()
