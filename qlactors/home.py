"""What belongs to one home directory at run time: the runtime lock and the nudge endpoint."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
from pathlib import Path

from .errors import QlactorsError

LOCK_FILE = "runtime.lock"
RECOVERY_STATUS_FILE = "recovery-status.json"  # written by Recovery, read by `status`
DISK_HOLD_FILE = "disk-hold.json"  # written by the Supervisor while the disk reserve holds attempts back


class AlreadyRunning(QlactorsError):
    """Another runtime holds this home's lock."""


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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
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
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


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
