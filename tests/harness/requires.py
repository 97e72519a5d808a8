"""What a test needs from the machine (PostgreSQL, busybox, strace, unshare, mount rights, GNU dd):
missing on a developer's box it skips; under CI=true (.ci/run, which installs it) it fails."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

IN_CI = os.environ.get("CI") == "true"


def unavailable(what: str, why: str) -> NoReturn:
    """Skip the test because `what` is missing (`why` says how it was found missing); a failure
    instead under CI=true, where .ci/run provides every such requirement and a skip would hide
    that the test never ran."""
    if IN_CI:
        pytest.fail(f"{what} is required in CI and is not available: {why}")
    pytest.skip(f"{what} is not available: {why} (set CI=true to make this a failure)")
