"""AES-GCM encryption at rest: the envelope, failing closed, legacy plaintext, rotation."""

import base64
import os
import sys

import pytest

from flowwarden_django.exceptions import MissingExtraError
from flowwarden_django.workflows.storage.encryption import (
    PREFIX,
    AesGcmCipher,
    SnapshotDecryptionError,
    decode_key,
    generate_key,
    is_encrypted,
    reveal,
)

KEY = generate_key()
OTHER = generate_key()


def test_round_trip_and_envelope_format():
    cipher = AesGcmCipher.from_base64(KEY)
    sealed = cipher.encrypt("état ✓")
    assert sealed.startswith(PREFIX) and is_encrypted(sealed)
    blob = base64.b64decode(sealed[len(PREFIX) :])
    # 12-byte nonce, the UTF-8 ciphertext (same length as the text), 16-byte tag.
    assert len(blob) == 12 + len("état ✓".encode()) + 16
    assert cipher.decrypt(sealed) == "état ✓"


def test_each_value_gets_a_fresh_nonce():
    cipher = AesGcmCipher.from_base64(KEY)
    assert cipher.encrypt("same") != cipher.encrypt("same")


def test_none_and_legacy_plaintext_pass_through():
    cipher = AesGcmCipher.from_base64(KEY)
    assert cipher.encrypt(None) is None
    assert cipher.decrypt(None) is None
    assert cipher.decrypt('{"plain": true}') == '{"plain": true}'


def test_a_wrong_key_fails_closed():
    sealed = AesGcmCipher.from_base64(KEY).encrypt("secret")
    with pytest.raises(SnapshotDecryptionError, match="wrong key or tampered"):
        AesGcmCipher.from_base64(OTHER).decrypt(sealed)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda s: s[:-4] + ("AAAA" if not s.endswith("AAAA") else "BBBB"),
        lambda s: s[: len(PREFIX) + 8],
        lambda s: s + "!",
    ],
    ids=["flipped", "truncated", "not-base64"],
)
def test_tampered_values_fail_closed(tamper):
    cipher = AesGcmCipher.from_base64(KEY)
    with pytest.raises(SnapshotDecryptionError):
        cipher.decrypt(tamper(cipher.encrypt("secret value")))


def test_associated_data_binds_a_value_to_its_place():
    cipher = AesGcmCipher.from_base64(KEY)
    sealed = cipher.encrypt("state", b"snapshot-1:state")
    assert cipher.decrypt(sealed, b"snapshot-1:state") == "state"
    with pytest.raises(SnapshotDecryptionError):
        cipher.decrypt(sealed, b"snapshot-2:state")


def test_rotation_encrypts_with_the_first_key_and_decrypts_with_any():
    old = AesGcmCipher.from_base64(OTHER)
    rotated = AesGcmCipher.from_base64(KEY, OTHER)
    assert rotated.decrypt(old.encrypt("old row")) == "old row"
    new_row = rotated.encrypt("new row")
    assert AesGcmCipher.from_base64(KEY).decrypt(new_row) == "new row"
    with pytest.raises(SnapshotDecryptionError):
        old.decrypt(new_row)


def test_reveal_without_a_cipher_refuses_encrypted_values():
    sealed = AesGcmCipher.from_base64(KEY).encrypt("x")
    assert reveal("plain", None) == "plain"
    assert reveal(None, None) is None
    with pytest.raises(SnapshotDecryptionError, match="no encryption key"):
        reveal(sealed, None)


def test_keys_are_32_bytes_in_base64_or_raw():
    raw = os.urandom(32)
    assert decode_key(raw) == raw
    assert decode_key(base64.b64encode(raw).decode()) == raw
    assert decode_key(base64.urlsafe_b64encode(raw).decode().rstrip("=")) == raw
    AesGcmCipher(raw)
    AesGcmCipher.from_keys([raw, base64.b64encode(raw).decode()])


@pytest.mark.parametrize(
    ("key", "words"),
    [
        (base64.b64encode(b"k" * 31).decode(), "31 bytes long"),
        ("not base64 at all!", "not base64"),
        (12345, "must be base64 text or bytes"),
    ],
    ids=["short", "garbage", "wrong-type"],
)
def test_bad_keys_are_refused_without_echoing_them(key, words):
    with pytest.raises(ValueError, match=words) as info:
        AesGcmCipher.from_keys([KEY, key])
    assert "key 1" in str(info.value)
    assert str(key) not in str(info.value)


def test_no_keys_is_an_error():
    with pytest.raises(ValueError, match="no encryption key"):
        AesGcmCipher.from_keys([])


def test_missing_cryptography_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(MissingExtraError, match=r"flowwarden-django\[crypto\]"):
        AesGcmCipher.from_base64(KEY)
