"""Encryption at rest of snapshot state and metadata: AES-256-GCM.

An encrypted value is the text ``enc:v1:`` + base64(12-byte nonce ‖ ciphertext ‖
16-byte tag), with a fresh random nonce per value. A value without the prefix is
legacy plaintext and is returned as it is, so turning encryption on keeps older rows
readable (they are encrypted when next saved). State and metadata text written by
the stores never starts with ``enc:`` (JSON starts with ``{ [ " n t f`` or a digit).

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

from ..exceptions import MissingExtraError

PREFIX = "enc:v1:"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16


class SnapshotDecryptionError(RuntimeError):
    """A stored value cannot be decrypted: wrong key, tampered data, or no key."""


def is_encrypted(text: str | None) -> bool:
    """Whether *text* is an encrypted envelope (``enc:v1:...``)."""
    return text is not None and text.startswith(PREFIX)


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

        try:
            blob = base64.b64decode(text[len(PREFIX) :].encode("ascii"), validate=True)
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
    text: str | None, cipher: AesGcmCipher | None, associated_data: bytes | None = None
) -> str | None:
    """Plaintext of a stored value: decrypted with *cipher*, legacy plaintext as it is.

    An encrypted value and no cipher raises ``SnapshotDecryptionError`` (fail closed).
    """
    if cipher is not None:
        return cipher.decrypt(text, associated_data)
    if is_encrypted(text):
        raise SnapshotDecryptionError(
            "snapshot value is encrypted but the store has no encryption key"
        )
    return text
