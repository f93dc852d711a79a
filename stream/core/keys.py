"""Stream keys: one master key file per deployment, each stream's key derived from it with HKDF-SHA256.

The master key is 64 hex digits in a file of mode 0600, created on first start if absent. A stream's 256-bit key
is ``HKDF-SHA256(master, salt=b"tops/stream-key/v2", info=b"<identity>:<generation>:" + name)``.

**A key never meets two datasets.** The *identity* is 128 random bits drawn when a state store is created (a new
store, or a lost one, is a new identity) or, without durable state, when a run starts. The same master key file used
by two runs, two sites or a re-created store therefore gives unrelated noise: otherwise two runs on inputs that
differ in one reading would release the same noise plus different data, and their difference would reveal that
reading exactly. The identity is not secret (without the master key it says nothing): ``tops run`` prints it on
stderr and puts it in every status message, and ``tops replay --key-file FILE --identity ID --stream NAME``
reproduces any release offline. Keys never appear in logs, metrics, errors or the state store.

>>> master, run = bytes(32), "00" * 16
>>> derive_stream_key(master, "meter-1", identity=run) == derive_stream_key(master, "meter-1", identity=run)
True
>>> derive_stream_key(master, "meter-1", identity=run) != derive_stream_key(master, "meter-2", identity=run)
True
>>> derive_stream_key(master, "meter-1", identity=run) != derive_stream_key(master, "meter-1", identity="11" * 16)
True
>>> derive_stream_key(master, "meter-1", identity=run) != derive_stream_key(master, "meter-1", identity=run,
...                                                                        generation=2)
True
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from pathlib import Path

__all__ = ["KeyFileError", "check_identity", "derive_stream_key", "load_master_key", "new_identity", "parse_hex_key"]

_SALT = b"tops/stream-key/v2"
IDENTITY_HEX = 32  # 128 bits


def new_identity() -> str:
    """A fresh random identity (32 hex digits) for a new state store or a run without durable state."""
    return os.urandom(IDENTITY_HEX // 2).hex()


_IDENTITY = re.compile(f"[0-9a-f]{{{IDENTITY_HEX}}}")


def check_identity(text: str) -> str:
    """The identity in canonical form (32 lowercase hex digits); ``ValueError`` with one clear line otherwise."""
    t = text.strip().lower() if isinstance(text, str) else ""
    if _IDENTITY.fullmatch(t) is None:  # checked at every key derivation: a compiled pattern, not a loop
        msg = f"an identity is {IDENTITY_HEX} hex digits (as printed by tops run and in its status messages)"
        raise ValueError(msg)
    return t


class KeyFileError(Exception):
    """The master key file is missing, unreadable, malformed or too open."""


def parse_hex_key(text: str) -> bytes:
    """Parse 64 hex digits into 32 bytes; the message never echoes the input."""
    text = text.strip()
    if len(text) != 64:
        msg = "a key is 64 hex digits (256 bits)"
        raise ValueError(msg)
    try:
        return bytes.fromhex(text)
    except ValueError:
        msg = "a key is 64 hex digits (256 bits)"
        raise ValueError(msg) from None


def derive_stream_key(master: bytes, stream: str, *, identity: str, generation: int = 1) -> bytes:
    """The 256-bit key of ``stream`` in the store or run ``identity`` (generation 1 unless a new generation was
    asked for). The identity is required: a key derived without it would be the same in every run."""
    if len(master) != 32:
        msg = "the master key is 32 bytes"
        raise ValueError(msg)
    canonical = _CHECKED.get(identity) if isinstance(identity, str) else None
    if canonical is None:
        canonical = check_identity(identity)
        if len(_CHECKED) < 4:
            _CHECKED[identity] = canonical
    info = f"{canonical}:{int(generation)}:".encode() + stream.encode("utf-8") + b"\x01"
    master = bytes(master)  # a bytearray too (the cache below needs a hashable key)
    expand = _EXPAND.get(master)
    if expand is None:  # HKDF's Extract is the same for every stream of a master key: once (a key for each new stream)
        expand = _Hmac(hkdf_extract(_SALT, master))
        if len(_EXPAND) < 4:
            _EXPAND[master] = expand
    return expand.digest(info)  # Expand's one block: T(1) = HMAC(PRK, info || 0x01)


# master key -> HMAC keyed with HKDF-Extract(_SALT, master), kept only in this process's memory
_EXPAND: dict[bytes, _Hmac] = {}
_CHECKED: dict[str, str] = {}  # identities as given -> canonical (checked once, not at every new stream)


class _Hmac:
    """HMAC-SHA256 (RFC 2104) under one key, its two padded-key states hashed once: a message then costs its own hash
    and one block (``hmac.digest`` sets the key up on every call; a daemon derives a key for every new stream). A
    secret: never printed, never pickled."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > _BLOCK:
            key = hashlib.sha256(key).digest()
        key = key.ljust(_BLOCK, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def __repr__(self) -> str:
        return "_Hmac(<secret>)"

    def __reduce__(self):
        msg = "an HMAC key is a secret and is not picklable"
        raise TypeError(msg)

    def digest(self, message: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


_BLOCK = 64  # SHA-256's block, in bytes


def hkdf_sha256_32(salt: bytes, ikm: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 (RFC 5869) with a 32-byte output: Extract ``PRK = HMAC(salt, ikm)``, then Expand's one block
    ``T(1) = HMAC(PRK, info || 0x01)``. The same bytes as ``cryptography``'s ``HKDF(SHA256, length=32)`` (tested on
    RFC 5869's vector and on random inputs against it), as two calls into the standard library's HMAC: a daemon derives
    a key for every new stream and every stream restored after a restart (a million of them), where building
    ``cryptography``'s objects cost more than the hashing."""
    return hkdf_expand_32(hkdf_extract(salt, ikm), info)


def hkdf_extract(salt: bytes, ikm: bytes) -> bytes:
    """HKDF-Extract (RFC 5869, 2.2): ``PRK = HMAC-SHA256(salt, ikm)``."""
    return hmac.digest(salt, ikm, "sha256")


def hkdf_expand_32(prk: bytes, info: bytes) -> bytes:
    """HKDF-Expand (RFC 5869, 2.3) of one 32-byte block: ``T(1) = HMAC-SHA256(PRK, info || 0x01)``."""
    return _Hmac(prk).digest(info + b"\x01")


def load_master_key(path: str | os.PathLike[str], *, create: bool = False) -> bytes:
    """Read the master key file; with ``create`` write a fresh one (mode 0600) when it does not exist."""
    p = Path(path)
    if not p.exists():
        if not create:
            msg = f"master key file {p} does not exist"
            raise KeyFileError(msg)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            msg = f"master key file {p} cannot be created: its folder {p.parent} is not writable ({exc.strerror})"
            raise KeyFileError(msg) from None
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
    try:
        mode = p.stat().st_mode
        data = p.read_bytes()
    except OSError as exc:
        msg = f"master key file {p} cannot be read ({exc.strerror})"
        raise KeyFileError(msg) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        msg = f"master key file {p} must not be readable by group or others (chmod 600)"
        raise KeyFileError(msg)
    try:
        return parse_hex_key(data.decode("ascii"))
    except ValueError:
        msg = f"master key file {p} must hold 64 hex digits"
        raise KeyFileError(msg) from None
