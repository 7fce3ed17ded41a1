"""Sealed tokens: values this site hands out and reads back (paging cursors), which
nobody else can read or forge.

``seal`` encrypts with AES-256-GCM (the ``cryptography`` package) under a key derived
from ``SECRET_KEY`` for one *purpose*, so a token is opaque (its contents cannot be
read) as well as authentic (a changed or forged one is refused); the purpose is also
the associated data, so a token of one purpose is no token of another. Tokens sealed
under a key of ``SECRET_KEY_FALLBACKS`` still open, as Django's signing allows.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Any

from django.conf import settings
from django.utils.crypto import salted_hmac

from ..exceptions import MissingExtraError

NONCE_BYTES = 12


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise MissingExtraError("cryptography", "drf", "Opaque paging cursors") from exc
    return AESGCM


def _key(purpose: str, secret: str) -> bytes:
    return salted_hmac(
        purpose, "flowwarden sealing key", secret=secret, algorithm="sha256"
    ).digest()


def seal(payload: bytes, *, purpose: str) -> str:
    """*payload*, encrypted and authenticated for *purpose*, as URL-safe text."""
    cipher = _aesgcm()(_key(purpose, settings.SECRET_KEY))
    nonce = os.urandom(NONCE_BYTES)
    return _text(nonce + cipher.encrypt(nonce, payload, purpose.encode()))


def _text(blob: bytes) -> str:
    return base64.urlsafe_b64encode(blob).rstrip(b"=").decode("ascii")


def unseal(text: str, *, purpose: str) -> bytes:
    """The payload ``seal`` sealed into *text* for *purpose*; ``ValueError`` for
    anything else (changed, forged, of another purpose or another site)."""
    from cryptography.exceptions import InvalidTag

    try:
        blob = base64.urlsafe_b64decode(text.encode("ascii") + b"=" * (-len(text) % 4))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ValueError("not a sealed token") from None
    # One text per token: base64 leaves the last character's low bits unread, so a
    # changed one could decode to the same bytes.
    if len(blob) < NONCE_BYTES + 16 or _text(blob) != text:
        raise ValueError("not a sealed token")
    nonce, sealed = blob[:NONCE_BYTES], blob[NONCE_BYTES:]
    aesgcm = _aesgcm()
    for secret in (settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ())):
        try:
            return aesgcm(_key(purpose, secret)).decrypt(nonce, sealed, purpose.encode())
        except InvalidTag:
            continue
    raise ValueError("not a sealed token")
