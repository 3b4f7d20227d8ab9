"""A job's files under the state folder: its instances and its results, both JSONL, one line per instance.

``JobFiles(root)`` keeps job ``id``'s files in ``root/<id>/`` (``root`` is ``<state folder>/jobs``). A large
job names its own instances file, which must lie under the state folder (``inside``): serving reads no
file a caller could not have put there. That file is read in place and must not change while the job runs.

Results: ``ResultsFile(path, offset)`` opens the file (``OSError`` when it is shorter than ``offset``, the
length recorded with the last finished batch: the job fails). ``write_at(offset, lines)`` writes one
batch's lines at the offset the runner's own recorded progress says, cutting the file there first, and
flushes them to disk before returning the new length; the runner records that length only afterwards. So
lines written by a batch whose progress was never recorded (a crash between the two, or a runner that lost
the job) are overwritten, never answered twice, and the file never grows past what its owner wrote.
``locked()`` holds an exclusive ``flock`` on the file: the runner checks that it still owns the job, writes
and records under it, so a runner that lost the job cannot write between another's check and record.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import orjson

from examlops.core.errors import InvalidInput
from examlops.jobs.model import Instance


class JobFiles:
    def __init__(self, root: Path, state_dir: Path) -> None:
        self.root = root
        self.state_dir = state_dir.resolve()

    def folder(self, job_id: str) -> Path:
        return self.root / job_id

    def instances_path(self, job_id: str) -> Path:
        return self.folder(job_id) / "instances.jsonl"

    def results_path(self, job_id: str) -> Path:
        return self.folder(job_id) / "results.jsonl"

    def write_instances(self, job_id: str, instances: Iterable[dict[str, Any]]) -> tuple[Path, int]:
        """Write inline instances as the job's instances file; its path and the number of lines."""
        path = self.instances_path(job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        count = 0
        with path.open("wb") as out:
            for instance in instances:
                out.write(orjson.dumps(instance) + b"\n")
                count += 1
        return path, count

    def inside(self, name: str) -> Path:
        """The instances file a caller named (relative to the state folder, or absolute within it), which
        must exist there; ``InvalidInput(field="file")`` otherwise (the message never names other paths)."""
        given = Path(name)
        path = (given if given.is_absolute() else self.state_dir / given).resolve()
        if not path.is_relative_to(self.state_dir):
            raise InvalidInput("file must be a path under the state folder of serving", field="file")
        if not path.is_file():
            raise InvalidInput(f"no file {name[:128]!r} under the state folder of serving", field="file")
        return path


def count_lines(path: Path) -> int:
    """The instances in a JSONL file: its non-blank lines."""
    with path.open("rb") as source:
        return sum(1 for line in source if line.strip())


def read_batches(path: Path, batch_size: int, start: int) -> Generator[list[Instance | InvalidInput], None, None]:
    """The file's instances from batch ``start`` on, ``batch_size`` at a time; a line that is not an instance
    is an ``InvalidInput`` in its place (it fails alone). ``OSError`` when the file cannot be read."""
    with path.open("rb") as source:
        lines = (line for line in source if line.strip())
        for _ in islice(lines, start * batch_size):
            pass
        while batch := [parse_instance(line) for line in islice(lines, batch_size)]:
            yield batch


def parse_instance(line: bytes) -> Instance | InvalidInput:
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError:
        return InvalidInput("the line is not JSON", field="instance")
    if not isinstance(data, dict):
        return InvalidInput("an instance is a JSON object", field="instance")
    embedding, node_count, user_id = data.get("embedding"), data.get("node_count"), data.get("user_id")
    if not isinstance(embedding, list) or not all(isinstance(v, int | float) for v in embedding):
        return InvalidInput("embedding must be a list of numbers", field="embedding")
    if not isinstance(node_count, int) or isinstance(node_count, bool):
        return InvalidInput("node_count must be an integer", field="node_count")
    if user_id is not None and not isinstance(user_id, str):
        return InvalidInput("user_id must be a string", field="user_id")
    return Instance(tuple(float(v) for v in embedding), node_count, user_id)


class ResultsFile:
    """The results file of one job run, written batch by batch at recorded offsets (contract above)."""

    def __init__(self, path: Path, offset: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+b")
        if os.fstat(self._file.fileno()).st_size < offset:  # lost or cut by hand: not what was recorded
            self._file.close()
            raise OSError(errno.EIO, "the results file is shorter than the results recorded")

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the file exclusively (against every other open of it, in this process or another)."""
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)

    def write_at(self, offset: int, lines: Sequence[dict[str, Any]]) -> int:
        """Cut the file at ``offset``, write ``lines`` there and flush them to disk; the file's new length."""
        self._file.seek(offset)
        self._file.truncate()
        self._file.write(b"".join(orjson.dumps(line) + b"\n" for line in lines))
        self._file.flush()
        os.fsync(self._file.fileno())
        return self._file.tell()

    def close(self) -> None:
        self._file.close()


def read_results(path: Path, length: int, chunk: int = 64 * 1024) -> Iterator[bytes]:
    """The first ``length`` bytes of a results file (what finished batches recorded), in chunks."""
    if length <= 0:
        return
    with path.open("rb") as source:
        left = length
        while left > 0 and (data := source.read(min(chunk, left))):
            left -= len(data)
            yield data
