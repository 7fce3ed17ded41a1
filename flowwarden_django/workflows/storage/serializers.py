"""How a snapshot's ``state`` becomes text and back: ``StateSerializer`` and the default
``JsonStateSerializer``.

The JSON serializer writes plain JSON for plain values and a tagged object
(``{"__fw__": "<tag>", "v": ...}``) for the rest, so these round-trip with their
types: ``datetime`` (aware or naive), ``date``, ``time``, ``timedelta``, ``Decimal``,
``UUID``, ``bytes``, ``tuple``, ``set``, ``frozenset``, dicts with non-string keys,
and dataclasses and enums whose class is registered::

    @workflow_state
    @dataclass
    class Order:
        number: str
        total: Decimal

A dataclass or enum is only ever rebuilt from the class registered under its label
(``register_state_type``), never from a class path read from the database: whoever
can write the table cannot make the app instantiate arbitrary classes. A label that
is not registered (the class was renamed, or its module not imported yet) comes back
as a plain dict of its fields (an enum as its value), with a warning.

A store takes another serializer with the ``serializer`` option: an instance, a
class, or the dotted path of either.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import logging
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from django.utils.module_loading import import_string

logger = logging.getLogger("flowwarden_django.workflows")

T = TypeVar("T", bound=type)

#: The key that marks a tagged value in the JSON text.
TAG = "__fw__"


def _not_serializable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_text_encoder(*, sort_keys: bool = False) -> Callable[[Any], str]:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=...)``
    with the encoder set up once: ``json.dumps`` with options, and even a kept
    ``JSONEncoder``, set one up on every call (every workflow step makes two texts).

    The values handed to it are checked already (``_encode``, snapshot metadata), so
    it has no circular-reference check: the walk before it would have failed first.
    """
    make = json.encoder.c_make_encoder
    if make is None:  # no C accelerator
        encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys)
        return encoder.encode
    chunks = make(
        None,  # markers: no circular-reference check
        _not_serializable,  # default
        json.encoder.encode_basestring,  # ensure_ascii=False
        None,  # indent
        ":",  # key separator
        ",",  # item separator
        sort_keys,
        False,  # skipkeys
        True,  # allow_nan
    )

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode


#: The state's text, as ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``.
_dumps = json_text_encoder()


class StateSerializer(ABC):
    """Turns workflow state into text and back.

    ``dumps(state)`` returns ``(text, type_label)``; stores keep both and hand them
    back to ``loads``. ``type_label`` (at most 255 characters are kept) names the
    state's top-level type for people and for serializers that need it; it must
    never be used to import a class.
    """

    @abstractmethod
    def dumps(self, state: Any) -> tuple[str, str]:
        """The text of *state* and a label of its type."""

    @abstractmethod
    def loads(self, text: str, type_label: str) -> Any:
        """The state *text* (written by ``dumps``) describes."""


class StateDecodeError(ValueError):
    """Stored state text cannot be read by this serializer (corrupt, or from a newer one)."""


# -- the registry of state types ------------------------------------------------------

_types: dict[str, type] = {}
_labels: dict[type, str] = {}
_types_lock = threading.Lock()


def _default_label(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_state_type(cls: T, name: str | None = None) -> T:
    """Allow instances of the dataclass or enum *cls* to be rebuilt from stored state.

    *name* is the label stored with each instance (default ``module.QualName``); give
    one to keep old snapshots readable after moving or renaming the class. Returns
    *cls*. Registering a different class under a taken label raises ``ValueError``
    (re-registering a reloaded class of the same module and name replaces it).
    """
    if not isinstance(cls, type) or not (
        dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum)
    ):
        raise TypeError(f"only dataclasses and enums can be registered, not {cls!r}")
    label = name or _default_label(cls)
    with _types_lock:
        existing = _types.get(label)
        if (
            existing is not None
            and existing is not cls
            and _default_label(existing) != _default_label(cls)
        ):
            raise ValueError(f"state type label {label!r} is already registered for {existing!r}")
        if existing is not None:
            _labels.pop(existing, None)
        _labels.pop(cls, None)
        _types[label] = cls
        _labels[cls] = label
    return cls


def workflow_state(cls: T | None = None, *, name: str | None = None) -> Any:
    """Class decorator form of :func:`register_state_type`: ``@workflow_state`` or
    ``@workflow_state(name="orders.Order")``."""
    if cls is None:
        return lambda klass: register_state_type(klass, name)
    return register_state_type(cls, name)


def unregister_state_type(cls_or_label: type | str) -> None:
    """Forget a registration (by class or label); mostly for tests."""
    with _types_lock:
        if isinstance(cls_or_label, str):
            cls = _types.pop(cls_or_label, None)
            if cls is not None:
                _labels.pop(cls, None)
        else:
            label = _labels.pop(cls_or_label, None)
            if label is not None:
                _types.pop(label, None)


def registered_state_type(label: str) -> type | None:
    """The class registered under *label*, or ``None``."""
    return _types.get(label)


def state_type_label(cls: type) -> str:
    """The label instances of *cls* are stored under (registered or default)."""
    return _labels.get(cls) or _default_label(cls)


# -- the JSON serializer --------------------------------------------------------------


class JsonStateSerializer(StateSerializer):
    """JSON text, with tagged values for the types plain JSON loses (see the module).

    ``dumps`` raises ``TypeError`` for a value it cannot represent (an arbitrary
    object): register it as a dataclass, convert it, or use another serializer.
    """

    def dumps(self, state: Any) -> tuple[str, str]:
        return _dumps(self._encode(state)), self.type_label(state)

    def loads(self, text: str, type_label: str = "") -> Any:
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise StateDecodeError(f"stored state is not JSON: {exc}") from exc
        return self._decode(raw)

    @staticmethod
    def type_label(state: Any) -> str:
        """``module.QualName`` of dataclasses and enums, the builtin name otherwise."""
        cls = type(state)
        if cls is dict:
            return "dict"
        if isinstance(state, enum.Enum) or dataclasses.is_dataclass(cls):
            return state_type_label(cls)
        return cls.__name__

    # -- encoding --

    def _encode(self, value: Any) -> Any:
        kind = type(value)
        if kind is str or kind is int or kind is float or kind is bool or value is None:
            return value  # the common cases first (subclasses take the long way)
        if kind is dict:
            if _flat(value):
                return value  # JSON as it is: nothing to tag, nothing to copy
            return self._encode_mapping(value)
        if isinstance(value, enum.Enum):
            return {TAG: "enum", "t": state_type_label(type(value)), "v": self._encode(value.value)}
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, list):
            return [self._encode(item) for item in value]
        if isinstance(value, Mapping):
            return self._encode_mapping(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {
                f.name: self._encode(getattr(value, f.name)) for f in dataclasses.fields(value)
            }
            return {TAG: "dataclass", "t": state_type_label(type(value)), "v": fields}
        for kind, encode in _SCALARS:
            if isinstance(value, kind):
                tag, payload = encode(value)
                return {TAG: tag, "v": payload}
        for kind, tag in ((tuple, "tuple"), (frozenset, "frozenset"), (set, "set")):
            if isinstance(value, kind):
                return {TAG: tag, "v": [self._encode(item) for item in value]}
        raise TypeError(
            f"cannot serialize {type(value).__qualname__} in workflow state: use JSON types, "
            "a dataclass or enum (registered with @workflow_state to be rebuilt), or "
            "another serializer"
        )

    def _encode_mapping(self, value: Mapping[Any, Any]) -> Any:
        if all(isinstance(key, str) for key in value) and TAG not in value:
            return {key: self._encode(item) for key, item in value.items()}
        # Non-string keys, or a key that would read as a tag: keep the pairs.
        return {TAG: "dict", "v": [[self._encode(k), self._encode(v)] for k, v in value.items()]}

    # -- decoding --

    def _decode(self, raw: Any) -> Any:
        if isinstance(raw, list):
            return [self._decode(item) for item in raw]
        if not isinstance(raw, dict):
            return raw
        if TAG not in raw:
            return {key: self._decode(item) for key, item in raw.items()}
        tag = raw[TAG]
        payload = raw.get("v")
        if tag in _DECODERS:
            try:
                return _DECODERS[tag](payload)
            except (TypeError, ValueError, ArithmeticError) as exc:
                raise StateDecodeError(f"bad {tag} value {payload!r} in stored state") from exc
        if tag == "dict":
            return {self._hashable(self._decode(k)): self._decode(v) for k, v in payload}
        if tag in ("tuple", "set", "frozenset"):
            items = [self._decode(item) for item in payload]
            if tag == "tuple":
                return tuple(items)
            items = [self._hashable(item) for item in items]
            return set(items) if tag == "set" else frozenset(items)
        if tag == "dataclass":
            return self._decode_dataclass(raw.get("t", ""), payload)
        if tag == "enum":
            return self._decode_enum(raw.get("t", ""), self._decode(payload))
        raise StateDecodeError(f"unknown tag {tag!r} in stored state (written by a newer version?)")

    @staticmethod
    def _hashable(value: Any) -> Any:
        # Decoded lists (from a tuple key written by another serializer) cannot be keys.
        return tuple(value) if isinstance(value, list) else value

    def _decode_dataclass(self, label: str, payload: Mapping[str, Any]) -> Any:
        values = {name: self._decode(item) for name, item in payload.items()}
        cls = registered_state_type(label)
        if cls is None or not dataclasses.is_dataclass(cls):
            logger.warning(
                "workflow state type %r is not registered (@workflow_state): read as a plain dict",
                label,
            )
            return values
        fields = {f.name: f for f in dataclasses.fields(cls)}
        try:
            instance = cls(**{k: v for k, v in values.items() if k in fields and fields[k].init})
            for name, value in values.items():
                if name in fields and not fields[name].init:
                    object.__setattr__(instance, name, value)
        except (TypeError, ValueError) as exc:
            logger.warning(
                "stored workflow state does not fit %r any more (%s): read as a plain dict",
                label,
                exc,
            )
            return values
        return instance

    def _decode_enum(self, label: str, value: Any) -> Any:
        cls = registered_state_type(label)
        if cls is None or not issubclass(cls, enum.Enum):
            logger.warning(
                "workflow state type %r is not registered (@workflow_state): read as its value",
                label,
            )
            return value
        try:
            return cls(value)
        except ValueError:
            logger.warning("%r is no longer a member of %r: read as its value", value, label)
            return value


def _flat(value: dict[Any, Any]) -> bool:
    """Whether a dict is plain JSON one level deep: string keys (none of them ``TAG``)
    to strings, numbers, booleans or ``None`` (no subclasses: an ``IntEnum`` is tagged)."""
    if TAG in value:
        return False
    for key, item in value.items():
        kind = type(item)
        if type(key) is not str or not (
            kind is str or kind is int or kind is float or kind is bool or item is None
        ):
            return False
    return True


def _encode_datetime(value: datetime) -> tuple[str, str]:
    return "datetime", value.isoformat()


_SCALARS: list[tuple[type, Callable[[Any], tuple[str, Any]]]] = [
    # datetime before date: a datetime is a date.
    (datetime, _encode_datetime),
    (date, lambda v: ("date", v.isoformat())),
    (time, lambda v: ("time", v.isoformat())),
    (timedelta, lambda v: ("timedelta", [v.days, v.seconds, v.microseconds])),
    (Decimal, lambda v: ("decimal", str(v))),
    (uuid.UUID, lambda v: ("uuid", str(v))),
    (bytes | bytearray, lambda v: ("bytes", base64.b64encode(bytes(v)).decode("ascii"))),
]

_DECODERS: dict[str, Callable[[Any], Any]] = {
    "datetime": datetime.fromisoformat,
    "date": date.fromisoformat,
    "time": time.fromisoformat,
    "timedelta": lambda v: timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "decimal": Decimal,
    "uuid": uuid.UUID,
    "bytes": lambda v: base64.b64decode(v.encode("ascii"), validate=True),
}


def resolve_serializer(value: Any = None) -> StateSerializer:
    """The serializer an option names: ``None`` (JSON), an instance, a class, or the
    dotted path of either. Raises ``ValueError`` with the reason otherwise."""
    if value is None:
        return JsonStateSerializer()
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise ValueError(f"cannot be imported: {exc}") from exc
    if isinstance(value, type):
        try:
            value = value()
        except TypeError as exc:
            raise ValueError(f"cannot be built without arguments: {exc}") from exc
    if not (callable(getattr(value, "dumps", None)) and callable(getattr(value, "loads", None))):
        raise ValueError("is not a StateSerializer (it needs dumps and loads methods)")
    return value
