"""The state serializer: what round-trips, what is refused, and the type registry."""

import enum
import json
import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest

from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.storage.serializers import (
    JsonStateSerializer,
    StateDecodeError,
    StateSerializer,
    register_state_type,
    registered_state_type,
    resolve_serializer,
    unregister_state_type,
    workflow_state,
)
from flowwarden_django.workflows.storage.snapshot import WorkflowSnapshot

serializer = JsonStateSerializer()


def round_trip(value):
    text, label = serializer.dumps(value)
    return serializer.loads(text, label)


@workflow_state
@dataclass
class Address:
    city: str
    zip: str | None = None


@workflow_state(name="tests.Customer")
@dataclass(frozen=True)
class Customer:
    name: str
    since: date
    addresses: tuple[Address, ...] = ()
    balance: Decimal = Decimal("0")
    computed: int = field(default=0, init=False)


@workflow_state
class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(2**70),
        1.5,
        "text ✓",
        [],
        {},
        [1, [2, [3]], {"a": None}],
        {"nested": {"deeper": [{"k": "v"}]}},
        datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC),
        datetime(2030, 1, 1, 12, 0, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
        datetime(2030, 1, 1, 12, 0),
        date(2030, 12, 31),
        time(23, 59, 59, 999999),
        timedelta(days=-1, seconds=5, microseconds=7),
        Decimal("0.1000"),
        Decimal("-1E+5"),
        uuid.UUID(int=7),
        b"\x00\xffbytes",
        (1, (2, 3), "x"),
        {1, 2, 3},
        frozenset({"a"}),
        {1: "int key", (1, 2): "tuple key", None: "none key"},
        {"__fw__": "a user key that looks like a tag"},
    ],
    ids=repr,
)
def test_values_round_trip_with_their_types(value):
    result = round_trip(value)
    assert result == value
    assert type(result) is type(value)


def test_aware_datetimes_keep_their_offset():
    moment = datetime(2030, 6, 1, 8, 0, tzinfo=timezone(timedelta(hours=9)))
    assert round_trip(moment).utcoffset() == timedelta(hours=9)
    assert round_trip(datetime(2030, 6, 1)).tzinfo is None


def test_decimal_keeps_its_exponent():
    assert str(round_trip(Decimal("1.2300"))) == "1.2300"


def test_registered_dataclasses_and_enums_are_rebuilt():
    customer = Customer("Ada", date(2020, 1, 2), (Address("Paris"), Address("Lyon", "69000")))
    object.__setattr__(customer, "computed", 42)
    state = {"customer": customer, "colour": Colour.BLUE, "colours": [Colour.RED]}
    result = round_trip(state)
    assert result == state
    assert type(result["customer"].addresses[0]) is Address
    assert result["customer"].computed == 42, "fields outside __init__ are restored too"
    assert result["colour"] is Colour.BLUE


def test_the_type_label_names_the_top_level_type():
    assert serializer.dumps({"a": 1})[1] == "dict"
    assert serializer.dumps(None)[1] == "NoneType"
    assert serializer.dumps(Customer("A", date(2020, 1, 1)))[1] == "tests.Customer"
    assert serializer.dumps(Address("x"))[1] == f"{__name__}.Address"


def test_an_unregistered_dataclass_comes_back_as_a_dict_with_a_warning(caplog):
    @dataclass
    class Unregistered:
        value: int
        when: date

    text, label = serializer.dumps(Unregistered(1, date(2030, 1, 1)))
    with caplog.at_level(logging.WARNING, logger="flowwarden_django.workflows"):
        result = serializer.loads(text, label)
    assert result == {"value": 1, "when": date(2030, 1, 1)}
    assert "is not registered" in caplog.text


def test_a_class_path_in_stored_text_is_never_imported(caplog):
    """A forged label naming an importable class is not instantiated."""
    forged = json.dumps({"__fw__": "dataclass", "t": "subprocess.Popen", "v": {"args": ["false"]}})
    with caplog.at_level(logging.WARNING, logger="flowwarden_django.workflows"):
        assert serializer.loads(forged, "subprocess.Popen") == {"args": ["false"]}


def test_a_dataclass_that_changed_shape_comes_back_as_a_dict(caplog):
    stored = json.dumps(
        {"__fw__": "dataclass", "t": f"{__name__}.Address", "v": {"town": "Old name"}}
    )
    with caplog.at_level(logging.WARNING, logger="flowwarden_django.workflows"):
        assert serializer.loads(stored, "") == {"town": "Old name"}
    assert "does not fit" in caplog.text


def test_an_enum_member_that_disappeared_comes_back_as_its_value(caplog):
    stored = json.dumps({"__fw__": "enum", "t": f"{__name__}.Colour", "v": "green"})
    with caplog.at_level(logging.WARNING, logger="flowwarden_django.workflows"):
        assert serializer.loads(stored, "") == "green"


def test_unsupported_values_are_refused_at_save():
    with pytest.raises(TypeError, match="cannot serialize object"):
        serializer.dumps({"x": object()})


@pytest.mark.parametrize(
    "text",
    ["not json", '{"__fw__": "future-tag", "v": 1}', '{"__fw__": "decimal", "v": "abc"}'],
)
def test_unreadable_text_raises_state_decode_error(text):
    with pytest.raises(StateDecodeError):
        serializer.loads(text, "")


def test_registration_rules():
    @dataclass
    class Local:
        x: int

    with pytest.raises(TypeError):
        register_state_type(object)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already registered"):
        register_state_type(Local, name="tests.Customer")
    register_state_type(Local, name="tests.Local")
    try:
        assert registered_state_type("tests.Local") is Local

        # A reloaded module defines a new class object with the same name: it replaces.
        @dataclass
        class Local:
            x: int

        register_state_type(Local, name="tests.Local")
        assert registered_state_type("tests.Local") is Local
        assert round_trip(Local(1)) == Local(1)
    finally:
        unregister_state_type("tests.Local")
    assert registered_state_type("tests.Local") is None


class Reversed(StateSerializer):
    """A custom serializer: reversed text of repr'd ints."""

    def dumps(self, state):
        return str(state)[::-1], "int"

    def loads(self, text, type_label):
        return int(text[::-1])


def test_a_store_takes_a_serializer_by_dotted_path_class_or_instance():
    for option in (f"{__name__}.Reversed", Reversed, Reversed()):
        store = InMemorySnapshotStore(serializer=option)
        saved = store.save(WorkflowSnapshot.root("custom", 1234))
        assert store.load(saved.id).state == 1234
        assert store._entries[saved.id].state_text == "4321"


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("no.such.Serializer", "cannot be imported"),
        ("json.JSONDecodeError", "cannot be built"),
        ("json.dumps", "is not a StateSerializer"),
    ],
)
def test_bad_serializer_options_are_explained(option, words):
    with pytest.raises(ValueError, match=words):
        resolve_serializer(option)
