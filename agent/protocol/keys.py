"""Ed25519 keys: the cloud's signing key pair and the agent's ring of trusted public keys.

This module is imported by the edge agent: it must not import pyspark or anything from
``cloud``.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agent.engine.errors import ZodiacError, read_bytes
from agent.protocol.messages import _NAME, clip

# --- keys ---------------------------------------------------------------------------------


def _check_key_id(key_id: str) -> str:
    # The key id is a file name (<key_id>.key): keep it free of path separators.
    if not isinstance(key_id, str) or not _NAME.fullmatch(key_id):
        raise ValueError(f"a key id is made of [A-Za-z0-9._-], got {clip(key_id)}")
    return key_id


def generate_key_pair(directory: str | os.PathLike[str], key_id: str) -> tuple[Path, Path]:
    """Create ``<key_id>.key`` (PEM PKCS8, mode 0o600) and ``<key_id>.pub`` (PEM SPKI).

    Refuses to overwrite an existing key (``FileExistsError``): replacing a signing key by
    accident would make every device refuse the cloud's bundles. The private key file is created
    with ``O_EXCL`` and mode 0o600 from the start, so it is never readable by others, not even
    for an instant.
    """
    _check_key_id(key_id)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    private_path = folder / f"{key_id}.key"
    public_path = folder / f"{key_id}.pub"
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            raise FileExistsError(f"{path} already exists")
    private_key = Ed25519PrivateKey.generate()
    private_pem = private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may have removed bits we want
        os.write(fd, private_pem)
    finally:
        os.close(fd)
    public_path.write_bytes(public_pem)
    return private_path, public_path


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """``SHA256:`` and the unpadded base64 of the SHA-256 of the raw 32-byte public key: what
    an operator compares to tell that a device trusts the key the publisher signs with (the
    PEM files differ in layout, the fingerprint does not)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    digest = hashlib.sha256(raw).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Read an unencrypted PEM PKCS8 Ed25519 private key."""
    try:
        key = serialization.load_pem_private_key(
            read_bytes(path, "private key file"), password=None
        )
    except (ValueError, TypeError):  # not PEM, or encrypted
        raise ZodiacError(f"{os.fspath(path)}: not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ZodiacError(f"{os.fspath(path)}: not an Ed25519 private key")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """Read a PEM SubjectPublicKeyInfo Ed25519 public key."""
    try:
        key = serialization.load_pem_public_key(read_bytes(path, "public key file"))
    except ValueError:
        raise ZodiacError(f"{os.fspath(path)}: not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ZodiacError(f"{os.fspath(path)}: not an Ed25519 public key")
    return key


class KeyRing:
    """The public keys a device trusts, by key id.

    Several keys can be trusted at once so the cloud can rotate its signing key: devices get
    the new ``.pub`` first, then the cloud switches, then the old one is removed.
    """

    def __init__(self, keys: Mapping[str, Ed25519PublicKey] | None = None):
        self._keys: dict[str, Ed25519PublicKey] = {}
        for key_id, key in (keys or {}).items():
            self.add(key_id, key)

    @classmethod
    def from_directory(cls, directory: str | os.PathLike[str]) -> KeyRing:
        """Every ``*.pub`` file of ``directory``; the key id is the file name without ``.pub``."""
        if not Path(directory).is_dir():
            raise ZodiacError(f"trusted_keys: {os.fspath(directory)} is not a directory of keys")
        ring = cls()
        for path in sorted(Path(directory).glob("*.pub")):
            ring.add(path.stem, load_public_key(path))
        return ring

    def add(self, key_id: str, public_key: Ed25519PublicKey) -> None:
        if not isinstance(public_key, Ed25519PublicKey):
            raise TypeError(f"key {key_id!r} is not an Ed25519 public key")
        self._keys[_check_key_id(key_id)] = public_key

    def get(self, key_id: str) -> Ed25519PublicKey | None:
        return self._keys.get(key_id)

    def ids(self) -> list[str]:
        return sorted(self._keys)

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __len__(self) -> int:
        return len(self._keys)


class KeyDirectory:
    """The trusted keys of a directory of ``<key_id>.pub`` files, kept in step with it while the
    agent runs, so that the cloud's key can be rotated without restarting a device: a key file
    added is trusted from the next bundle on, a key file removed (revoked) is no longer.

    `current` looks at the directory (one ``scandir`` of a small folder: names, sizes,
    modification times, inodes) and reads the keys again only when that changed. At start a
    file that is not a key is an error (``zodiac-agent run`` refuses the configuration); while
    running it is skipped and reported in `problems`, the other keys still trusted, so that a
    half-copied file never stops a device from accepting its cloud's bundles."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.problems: list[str] = []
        self._seen = self._listing()
        self.ring = KeyRing.from_directory(self.directory)

    def _listing(self) -> tuple:
        try:
            with os.scandir(self.directory) as entries:
                found = []
                for entry in entries:
                    if entry.name.endswith(".pub"):
                        info = entry.stat()
                        found.append((entry.name, info.st_mtime_ns, info.st_size, info.st_ino))
        except OSError as error:
            return ("unreadable", str(error))
        return tuple(sorted(found))

    def current(self) -> KeyRing:
        """The keys as the directory holds them now (read again only if it changed)."""
        listing = self._listing()
        if listing != self._seen:
            self._seen = listing
            self.reload()
        return self.ring

    def reload(self) -> KeyRing:
        """Read every key file again: unreadable ones are skipped and listed in `problems`
        (an unreadable directory trusts no key, until it can be read again)."""
        ring, problems = KeyRing(), []
        try:
            paths = sorted(self.directory.glob("*.pub"))
        except OSError as error:
            paths, problems = [], [f"trusted_keys {self.directory}: {error}"]
        if not self.directory.is_dir():
            problems.append(f"trusted_keys {self.directory} is not a directory of keys")
        for path in paths:
            try:
                ring.add(path.stem, load_public_key(path))
            except (ZodiacError, ValueError) as error:
                problems.append(str(error))
        self.ring, self.problems = ring, problems
        return ring
