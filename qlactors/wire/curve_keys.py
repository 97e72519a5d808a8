"""CurveZMQ key files (`qlactors keys new`): NAME.key (public) and NAME.key_secret (0600).

The files are zmq.auth's certificate format. Keys come back as Z85 text in bytes (40 bytes),
which is what the CURVE socket options take and what the allow-list stores.
"""

from __future__ import annotations

import os
import stat
import struct
import re
import shutil
import tempfile
from pathlib import Path

from ..errors import BadInput

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
Z85_KEY_LENGTH = 40  # a 32-byte CURVE key in Z85


def key_paths(directory: str | os.PathLike, name: str) -> tuple[Path, Path]:
    """Where `new_key_pair(directory, name)` puts the pair: (public, secret)."""
    base = Path(directory) / name
    return base.with_name(f"{name}.key"), base.with_name(f"{name}.key_secret")


def new_key_pair(directory: str | os.PathLike, name: str) -> tuple[Path, Path]:
    """Make a key pair in `directory` (created 0700 if missing); never overwrites either file.

    The pair is written in a private temporary directory, the secret made 0600 there, then both
    are hard-linked into place (a link never replaces an existing name), so no other user can
    ever read the secret and a concurrent `keys new` of the same name cannot mix two pairs.
    """
    import zmq.auth

    if not _NAME.match(name):
        raise BadInput(f"key name {name!r}: use 1-128 letters, digits, '.', '_' or '-', starting "
                       "with a letter or digit")
    directory = Path(directory)
    public, secret = key_paths(directory, name)
    for path in (public, secret):
        if path.exists() or path.is_symlink():
            raise BadInput(f"{path} already exists; nothing was written: remove the old pair first "
                           "or choose another name (a key in use stays valid until revoked)")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".keys-", dir=directory))
    except OSError as err:
        raise BadInput(f"cannot create {directory}: {err.strerror}") from None
    linked: list[Path] = []
    try:
        made_public, made_secret = (Path(p) for p in zmq.auth.create_certificates(scratch, name))
        os.chmod(made_secret, 0o600)
        os.chmod(made_public, 0o644)
        for made, final in ((made_secret, secret), (made_public, public)):
            try:
                os.link(made, final)
            except FileExistsError:
                raise BadInput(f"{final} appeared meanwhile; nothing of this pair was kept") from None
            linked.append(final)
    except BaseException:
        for path in linked:
            path.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return public, secret


# What to do about a missing key file, unless the caller knows better: make the pair it belongs to.
MAKE_A_PAIR = "make a pair with `qlactors keys new NAME`"
# A worker's `server_key` is the public half of the pair the replicas already share: a new pair
# would never match their secret key.
COPY_THE_REPLICAS_KEY = ("is the control replicas' public key: copy their control.key (beside "
                         "control.key_secret on a replica host) here; a new pair from `keys new` "
                         "would not match theirs")


def load_public_key(path: str | os.PathLike, *, missing: str = MAKE_A_PAIR) -> bytes:
    """The public key (Z85) of a key file: NAME.key, or the public half of NAME.key_secret.
    `missing`: what the error tells to do when there is no such file."""
    public, _secret = _load(Path(path), missing)
    return public


def load_key_pair(secret_path: str | os.PathLike) -> tuple[bytes, bytes]:
    """(public, secret), both Z85, from a NAME.key_secret file that only its owner can read or
    write (like ssh: a secret key file group or others may read or write is refused, with the
    `chmod 600` that fixes it; `keys new` writes it 0600)."""
    path = Path(secret_path)
    public, secret = _load(path, MAKE_A_PAIR)
    if secret is None:
        raise BadInput(f"key file {path} holds no secret key: give the NAME.key_secret file "
                       "(NAME.key is the public half)")
    check_private(path)
    return public, secret


def check_private(path: Path) -> None:
    """BadInput unless group and others have no access to `path` (the file a symlink names)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError as err:
        raise BadInput(f"key file {path}: {err.strerror}") from None
    if mode & 0o077:
        how = "readable" if mode & 0o044 else "writable"
        raise BadInput(f"{path} is {how} by others (mode {mode:04o}); run: chmod 600 {path}")


def _load(path: Path, missing: str) -> tuple[bytes, bytes | None]:
    import zmq.auth

    if not path.is_file():
        raise BadInput(f"key file {path} does not exist (or is not a file): {missing}")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (ValueError, OSError, UnicodeDecodeError) as err:
        raise BadInput(f"key file {path} is not a CurveZMQ key file ({err})") from None
    for which, key in (("public", public), ("secret", secret)):
        if key is not None and not _is_z85_key(key):
            raise BadInput(f"key file {path}: its {which} key is not a 40-character Z85 CURVE key")
    return public, secret


def _is_z85_key(key: bytes) -> bool:
    import zmq.utils.z85

    if len(key) != Z85_KEY_LENGTH:
        return False
    try:
        return len(zmq.utils.z85.decode(key)) == 32
    except (ValueError, KeyError, TypeError, struct.error):
        return False
