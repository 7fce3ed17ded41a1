"""Encryption at rest of snapshot state and metadata: AES-256-GCM.

An encrypted value is the text ``enc:v2:`` + base64(12-byte nonce ‖ ciphertext ‖
16-byte tag), with a fresh random nonce per value. The version names the associated
data the store bound the value to: ``v2`` values (written now) are bound to their
coordination, row and column, ``v1`` values (written before) to their row and
column only, so the ORM store refuses them until ``flowwarden_workflows reencrypt``
re-encrypts them as ``v2``. State and metadata text written by the stores never
starts with ``enc:`` (JSON starts with ``{ [ " n t f`` or a digit).

A value without the prefix is plaintext. A store that encrypts refuses it
(``require_encryption``, the default), so nobody who can write to the table can slip
in a state unnoticed; with ``require_encryption=False`` plaintext rows written
before encryption was turned on stay readable until they are saved again.

Reading fails closed: a wrong key, tampered data, or an encrypted value read by a
store without a key raises ``SnapshotDecryptionError``, never returns garbage.

Key rotation: give several keys; the first encrypts, any of them decrypts. Needs
the ``cryptography`` package (``pip install "flowwarden-django[crypto]"``).
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Sequence
from typing import Any

from ...exceptions import MissingExtraError

PREFIX = "enc:v2:"
#: The envelope of values written before they were bound to their run: stores refuse
#: it until re-encrypted (``OrmSnapshotStore.reencrypt_legacy``).
LEGACY_PREFIX = "enc:v1:"
#: The envelopes a cipher opens, newest first.
PREFIXES = (PREFIX, LEGACY_PREFIX)
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16


class SnapshotDecryptionError(RuntimeError):
    """A stored value cannot be decrypted: wrong key, tampered data, or no key."""


def is_encrypted(text: str | None) -> bool:
    """Whether *text* is an encrypted envelope (``enc:v2:...`` or ``enc:v1:...``)."""
    return text is not None and text.startswith(PREFIXES)


def envelope_version(text: str | None) -> int | None:
    """2 or 1 for an envelope of that version, ``None`` for plaintext."""
    if text is None:
        return None
    for prefix in PREFIXES:
        if text.startswith(prefix):
            return int(prefix[len("enc:v") : -1])
    return None


def decode_key(value: str | bytes) -> bytes:
    """A 32-byte key from raw bytes or base64 text (standard or URL-safe, padding
    optional). Raises ``ValueError``; the message never contains the key."""
    if isinstance(value, bytes | bytearray):
        raw = bytes(value)
    elif isinstance(value, str):
        text = value.strip()
        text += "=" * (-len(text) % 4)
        try:
            if "-" in text or "_" in text:
                raw = base64.urlsafe_b64decode(text.encode("ascii"))
            else:
                raw = base64.b64decode(text.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise ValueError("is not base64 text") from None
    else:
        raise ValueError(f"must be base64 text or bytes, not {type(value).__name__}")
    if len(raw) != KEY_BYTES:
        raise ValueError(f"is {len(raw)} bytes long; an AES-256 key is {KEY_BYTES} bytes")
    return raw


def generate_key() -> str:
    """A new random key, as base64 text for ``encryption_keys``."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise MissingExtraError("cryptography", "crypto", "Snapshot encryption") from exc
    return AESGCM


class AesGcmCipher:
    """AES-256-GCM over text, in the ``enc:v1:`` envelope. Thread-safe.

    ``AesGcmCipher(key, previous_keys=[older, ...])``: *key* encrypts; it and every
    previous key decrypt. ``associated_data`` (optional, the same on both sides)
    binds a value to its context: the stores pass the snapshot id and the column,
    so a value copied into another row or column does not decrypt.
    """

    def __init__(self, key: bytes, *, previous_keys: Sequence[bytes] = ()) -> None:
        aesgcm = _aesgcm()
        self._ciphers = [aesgcm(decode_key(k)) for k in (key, *previous_keys)]

    @classmethod
    def from_base64(cls, key: str, *previous_keys: str) -> AesGcmCipher:
        """A cipher from base64 keys (the first encrypts)."""
        return cls.from_keys([key, *previous_keys])

    @classmethod
    def from_keys(cls, keys: str | bytes | Sequence[str | bytes]) -> AesGcmCipher:
        """A cipher from one key or a list of keys (base64 text or raw bytes; the
        first encrypts). Raises ``ValueError`` naming the bad key's position."""
        if isinstance(keys, str | bytes | bytearray):
            keys = [keys]
        keys = list(keys)
        if not keys:
            raise ValueError("no encryption key given")
        decoded = []
        for index, key in enumerate(keys):
            try:
                decoded.append(decode_key(key))
            except ValueError as exc:
                raise ValueError(f"key {index} {exc}") from None
        return cls(decoded[0], previous_keys=decoded[1:])

    def encrypt(self, text: str | None, associated_data: bytes | None = None) -> str | None:
        """The envelope of *text* (``None`` stays ``None``)."""
        if text is None:
            return None
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[0].encrypt(nonce, text.encode("utf-8"), associated_data)
        return PREFIX + base64.b64encode(nonce + sealed).decode("ascii")

    def decrypt(self, text: str | None, associated_data: bytes | None = None) -> str | None:
        """The plaintext of an envelope; text without the prefix is returned as it is.

        Raises ``SnapshotDecryptionError`` when no key opens it.
        """
        if not is_encrypted(text):
            return text
        from cryptography.exceptions import InvalidTag

        body = text.split(":", 2)[2]
        try:
            blob = base64.b64decode(body.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise SnapshotDecryptionError("encrypted snapshot value is not valid base64") from None
        if len(blob) < NONCE_BYTES + TAG_BYTES:
            raise SnapshotDecryptionError("encrypted snapshot value is truncated")
        nonce, sealed = blob[:NONCE_BYTES], blob[NONCE_BYTES:]
        for cipher in self._ciphers:
            try:
                plain = cipher.decrypt(nonce, sealed, associated_data)
            except InvalidTag:
                continue
            return plain.decode("utf-8")
        raise SnapshotDecryptionError(
            "snapshot decryption failed: wrong key or tampered data"
        ) from None


def reveal(
    text: str | None,
    cipher: AesGcmCipher | None,
    associated_data: bytes | None = None,
    *,
    require_encryption: bool = False,
) -> str | None:
    """Plaintext of a stored value: decrypted with *cipher*; plaintext as it is unless
    *require_encryption* (then it raises ``SnapshotDecryptionError``).

    An encrypted value and no cipher raises ``SnapshotDecryptionError`` (fail closed).
    """
    if cipher is not None:
        if require_encryption and not is_encrypted(text):
            raise SnapshotDecryptionError(
                "a plaintext value in a store that requires encryption (written by "
                "someone without the key, or before encryption was turned on)"
            )
        return cipher.decrypt(text, associated_data)
    if is_encrypted(text):
        raise SnapshotDecryptionError(
            "snapshot value is encrypted but the store has no encryption key"
        )
    return text
