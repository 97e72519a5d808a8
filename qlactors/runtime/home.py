"""Shared: what belongs to one home directory at run time: the runtime lock and the nudge endpoint."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import json
import os
from pathlib import Path

from ..errors import BadInput, QlactorsError

LOCK_FILE = "runtime.lock"
RECOVERY_STATUS_FILE = "recovery-status.json"  # written by Recovery, read by `status`
DISK_HOLD_FILE = "disk-hold.json"  # written by the Supervisor while the disk reserve holds attempts back
FILE_MODE = 0o600  # every file in the home; directories are 0700


class AlreadyRunning(QlactorsError):
    """Another runtime holds this home's lock."""


class HomeUnusable(BadInput):
    """The home cannot be used as it is (not writable, or its database gone); nothing was changed."""


LEFTOVER_DIRS = ("logs", "receipts")
_WRITES = itertools.count()  # temp names of status files
_LEFTOVER_COUNT_LIMIT = 10_000  # counting stops here: the point is that something is there


def check_home(home: Path, database_url: str, *, audit: bool = False) -> Path | None:
    """Refuse a home no command can work in; None when it is fine.

    Not writable: SQLite must write beside its database even to read it (WAL index), and the
    runtime writes its lock, logs and receipts there. No database while `logs/` or `receipts/`
    hold files of earlier runs: creating an empty one would silently forget those runs (and let
    their receipts be judged orphans), so only `audit` (`audit=True`), which never creates a
    database, may go on: it gets the missing database's path back.
    """
    home = Path(home)
    if not os.access(home, os.W_OK | os.X_OK):
        raise HomeUnusable(
            f"home {home} is not writable ({_why_not_writable(home)}): qlactors keeps its database, "
            "logs and receipts there and writes even to read them; nothing was changed: make it "
            "writable, or pass --home (or set QLACTORS_HOME) to a writable directory")
    database = _missing_database(database_url)
    if database is None:
        return None
    if audit:
        return database
    found = {name: _count_files(home / name) for name in LEFTOVER_DIRS}
    if any(found.values()):
        held = " and ".join(f"{_plural(n)} under {name}/" for name, n in found.items() if n)
        raise HomeUnusable(
            f"no database at {database}, but {home} holds {held} from earlier runs; nothing was "
            f"created: restore {database.name} from a backup, or move "
            f"{' and '.join(f'{name}/' for name in LEFTOVER_DIRS)} aside to start afresh "
            "(`qlactors audit receipts` lists the receipts no database knows)")
    return None


def _why_not_writable(home: Path) -> str:
    try:
        if os.statvfs(home).f_flag & os.ST_RDONLY:
            return "it is on a read-only file system"
    except OSError:
        pass
    return f"permission denied for uid {os.getuid()}"


def _missing_database(database_url: str) -> Path | None:
    """The SQLite file the URL names, when it does not exist (None: it exists, or not SQLite)."""
    from sqlalchemy.engine import make_url  # the commands that get here open the store anyway
    from sqlalchemy.exc import ArgumentError

    from ..store.sqlite import database_path

    try:
        url = make_url(database_url)
    except ArgumentError:
        raise BadInput(f"[database] url = {database_url!r} is not a database URL: use "
                       "sqlite:///PATH or postgresql+psycopg://USER@HOST/DB") from None
    path = database_path(url)
    return None if path is None or path.exists() else path


def _count_files(root: Path) -> int:
    """Regular files below `root` (bounded; a missing root has none)."""
    count = 0
    for _dirpath, _dirnames, filenames in os.walk(root):
        count += len(filenames)
        if count >= _LEFTOVER_COUNT_LIMIT:
            break
    return count


def _plural(n: int) -> str:
    more = "+" if n >= _LEFTOVER_COUNT_LIMIT else ""
    return f"{n}{more} file" + ("" if n == 1 else "s")


def nudge_endpoint(home: Path) -> str:
    """An abstract ipc name (no path length limit, nothing left on disk), unique per home."""
    digest = hashlib.sha256(str(Path(home).absolute()).encode()).hexdigest()[:24]
    return f"ipc://@qlactors-{digest}"


class RuntimeLock:
    """An exclusive `flock` on `<home>/runtime.lock`, held for the runtime's whole life.

    It keeps a second runtime off the same home (a second bind would silently steal the nudge
    endpoint), and it is how `status` knows a runtime is up: the kernel drops it when the holder
    dies, even by `kill -9`.
    """

    def __init__(self, home: Path) -> None:
        self.path = Path(home) / LOCK_FILE
        self.fd = -1

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EACCES):
                holder = holder_pid(self.path.parent)
                raise AlreadyRunning(
                    f"a qlactors runtime (pid {holder or '?'}) already runs on {self.path.parent}; "
                    "stop it first, or use another --home") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def runtime_is_up(home: Path) -> bool:
    """True while some process holds the home's runtime lock."""
    path = Path(home) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def holder_pid(home: Path) -> int | None:
    try:
        text = (Path(home) / LOCK_FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def nudge(home: Path) -> bool:
    """Tell a running runtime to act now. Never blocks, never waits for a listener that is not there."""
    if not runtime_is_up(home):
        return False
    import zmq  # only commands that change intent pay for it

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    try:
        # A bounded linger (never 0-forever, never infinite): the message may wait 200 ms for
        # the connection to come up, then it is dropped; the runtime's cadence acts anyway.
        sock.setsockopt(zmq.LINGER, 200)
        sock.setsockopt(zmq.SNDHWM, 1)
        sock.connect(nudge_endpoint(home))
        try:
            sock.send(b"nudge", zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True
    finally:
        sock.close()
        ctx.term()


def _write_json(home: Path, name: str, data: dict) -> None:
    """Publish a small status file of the home atomically: temp file, then rename."""
    path = Path(home) / name
    # A temp name of its own per write: two writers of one file never share (or rename) a half-written one.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{next(_WRITES)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        with os.fdopen(fd, "w") as out:
            os.fchmod(fd, FILE_MODE)  # files in the home are the user's only, whatever the umask
            out.write(json.dumps(data))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_json(home: Path, name: str) -> dict | None:
    """A status file of the home, or None (no file, or one that cannot be read as an object)."""
    try:
        data = json.loads((Path(home) / name).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_recovery_status(home: Path, unresolved: dict[str, str]) -> None:
    """Publish the attempts recovery could not judge."""
    items = [{"attempt_id": aid, "why": why} for aid, why in sorted(unresolved.items())]
    _write_json(home, RECOVERY_STATUS_FILE, {"unresolved": items})


def read_recovery_status(home: Path) -> list[dict]:
    return (_read_json(home, RECOVERY_STATUS_FILE) or {}).get("unresolved", [])


def write_disk_hold(home: Path, *, free_bytes: int, reserve_bytes: int, path: str, since_ms: int) -> None:
    """Publish that new attempts are held back for lack of disk space."""
    _write_json(home, DISK_HOLD_FILE, {"free_bytes": free_bytes, "reserve_bytes": reserve_bytes,
                                       "path": path, "since_ms": since_ms})


def clear_disk_hold(home: Path) -> None:
    (Path(home) / DISK_HOLD_FILE).unlink(missing_ok=True)


def read_disk_hold(home: Path) -> dict | None:
    """The current disk-reserve hold, or None (no file, or one that cannot be read)."""
    return _read_json(home, DISK_HOLD_FILE)


STORE_OUTAGE_FILE = "store-outage.json"  # written while the database keeps failing, read by `status`


def write_store_outage(home: Path, *, since_ms: int, seconds: float, failures: int, error: str,
                       stop_after_ms: int) -> None:
    """Publish that the database is failing and the runtime retries (and when it will give up)."""
    _write_json(home, STORE_OUTAGE_FILE, {"since_ms": since_ms, "seconds": round(seconds, 3),
                                          "failures": failures, "error": error,
                                          "stop_after_ms": stop_after_ms})


def clear_store_outage(home: Path) -> None:
    (Path(home) / STORE_OUTAGE_FILE).unlink(missing_ok=True)


def read_store_outage(home: Path) -> dict | None:
    """The current database outage, or None (no file, or one that cannot be read)."""
    return _read_json(home, STORE_OUTAGE_FILE)


CYCLE_FAILURE_FILE = "cycle-failure.json"  # written while the cadence's cycles fail, read by `status`


def write_cycle_failure(home: Path, *, step: str, error: str, since_ms: int) -> None:
    """Publish that the cadence fails at `step` (nothing is offered meanwhile), and since when."""
    _write_json(home, CYCLE_FAILURE_FILE, {"step": step, "error": error, "since_ms": since_ms})


def clear_cycle_failure(home: Path) -> None:
    (Path(home) / CYCLE_FAILURE_FILE).unlink(missing_ok=True)


def read_cycle_failure(home: Path) -> dict | None:
    """The cadence's current failure, or None (no file, or one that cannot be read)."""
    return _read_json(home, CYCLE_FAILURE_FILE)
