"""The zone a trigger stores: an explicit IANA name, or the system zone read once from TZ or /etc/localtime.

A trigger always records a name, so a later change of the host's zone never moves its schedule
silently. This module reads the file system; the zone arithmetic stays in qlactors.domain.cron.
"""

from __future__ import annotations

import functools
import os
from typing import Mapping

from ..domain.cron import CronError, check_zone

LOCALTIME = "/etc/localtime"
TIMEZONE_FILE = "/etc/timezone"  # Debian and Alpine keep the name here too
_MARKER = "/zoneinfo/"
# Alternative trees of the same zones (leap-second "right/", legacy "posix/"): same names.
_SUBTREES = ("posix/", "right/")


def zone_name_from_path(path: str) -> str | None:
    """`Europe/Berlin` from `/usr/share/zoneinfo/Europe/Berlin` (or a posix/ or right/ copy)."""
    if _MARKER not in path:
        return None
    name = path.rsplit(_MARKER, 1)[1]
    for prefix in _SUBTREES:
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name or None


def _checked(name: str, source: str) -> str:
    try:
        return check_zone(name)
    except CronError as exc:
        raise CronError("zone", f"the system time zone from {source} is unusable: {exc}; "
                                f"pass --tz ZONE explicitly") from None


def read_system_zone(environ: Mapping[str, str] | None = None, localtime: str = LOCALTIME,
                     timezone_file: str = TIMEZONE_FILE) -> str:
    """The system zone's IANA name, looked up the way libc does: TZ first, then /etc/localtime.

    Arguments exist for tests; the runtime calls `system_zone()`. A copied (not linked)
    /etc/localtime carries no name: /etc/timezone is tried, else the user must pass --tz.
    """
    env = os.environ if environ is None else environ
    tz = env.get("TZ")
    if tz is not None:
        if tz in ("", ":"):
            return _checked("UTC", "TZ (empty means UTC)")  # libc reads an empty TZ as UTC
        name = tz[1:] if tz.startswith(":") else tz
        if name.startswith("/"):
            found = zone_name_from_path(name) or zone_name_from_path(os.path.realpath(name))
            if found is None:
                raise CronError("zone", f"TZ={tz!r} names a file outside any zoneinfo directory; "
                                        f"pass --tz ZONE explicitly")
            name = found
        return _checked(name, f"TZ={tz!r}")
    try:
        target = os.readlink(localtime)
    except FileNotFoundError:
        return _checked("UTC", f"{localtime} (missing: libc uses UTC)")
    except OSError:  # EINVAL: a regular file, copied from the zone database
        return _zone_from_timezone_file(localtime, timezone_file)
    if not os.path.isabs(target):
        target = os.path.join(os.path.dirname(localtime), target)
    # The link's own target is the name the administrator chose; realpath may land on an alias.
    name = zone_name_from_path(os.path.normpath(target)) or zone_name_from_path(os.path.realpath(localtime))
    if name is None:
        raise CronError("zone", f"{localtime} points to {target!r}, outside any zoneinfo directory; "
                                f"pass --tz ZONE explicitly")
    return _checked(name, localtime)


def _zone_from_timezone_file(localtime: str, timezone_file: str) -> str:
    try:
        with open(timezone_file, encoding="utf-8") as f:
            name = f.read(256).strip()
    except OSError:
        name = ""
    if not name:
        raise CronError("zone", f"{localtime} is a copied file, not a link, and {timezone_file} does "
                                f"not name the zone; pass --tz ZONE explicitly (e.g. --tz Europe/Berlin)")
    return _checked(name, timezone_file)


@functools.lru_cache(maxsize=1)
def system_zone() -> str:
    """The system zone, read once per process: every trigger created by this process agrees."""
    return read_system_zone()


def resolve_zone(name: str | None) -> str:
    """The zone to store for `--tz name`: the name itself once it loads, or the system zone when None."""
    if name is None:
        return system_zone()
    return check_zone(name)
