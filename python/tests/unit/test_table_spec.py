"""TableSpec: one value for a table's configuration, taken by create_table and returned by
Table.config."""

import dataclasses
import datetime as dt

import pytest

import embstore
from embstore import InvalidArgumentError, TableSpec


def test_create_table_takes_a_spec_and_config_returns_it():
    spec = TableSpec("user", 8, optimizer=embstore.Adam(lr=0.01), num_shards=2, ttl=30)
    store = embstore.Store()
    table = store.create_table(spec)
    assert isinstance(table.config, TableSpec)
    assert table.config == spec
    assert table.config.ttl == 30.0 and table.config.num_shards == 2


def test_keywords_and_spec_build_the_same_table():
    store = embstore.Store()
    a = store.create_table("a", 4, seed=7, on_non_finite="skip")
    b = store.create_table(TableSpec("b", 4, seed=7, on_non_finite="skip"))
    assert dataclasses.replace(a.config, name="b") == b.config


def test_spec_reads_as_the_keyword_arguments():
    spec = TableSpec("t", 4)
    assert spec["embedding_dim"] == 4
    assert {**spec} == {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    assert spec == {**spec}
    with pytest.raises(KeyError):
        spec["nope"]
    copy = embstore.Store().create_table(**{**spec, "name": "copy"})
    assert copy.config == dataclasses.replace(spec, name="copy")


def test_spec_is_frozen_and_hashable():
    spec = TableSpec("t", 4, ttl=dt.timedelta(minutes=1))
    assert spec.ttl == 60.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "u"  # type: ignore[misc]
    assert hash(spec) == hash(TableSpec("t", 4, ttl=60))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": 3}, "name must be a str, got 3"),
        ({"optimizer": "sgd"}, "optimizer must be an embstore optimizer"),
        ({"initializer": 0.1}, "initializer must be an embstore initializer"),
        ({"on_non_finite": "ignore"}, "on_non_finite must be 'error' or 'skip'"),
        ({"ttl": "1h"}, "ttl must be seconds or a timedelta"),
        ({"embedding_dim": 4.0}, "embedding_dim must be an int, got 4.0"),
        ({"seed": -1}, "seed must be in 0..2\\*\\*64, got -1"),
    ],
)
def test_spec_checks_fields_as_create_table_does(kwargs, message):
    args = {"name": "t", "embedding_dim": 4, **kwargs}
    with pytest.raises(InvalidArgumentError, match=message):
        TableSpec(**args)
    with pytest.raises(InvalidArgumentError, match=message):
        embstore.Store().create_table(**args)


def test_a_spec_and_keywords_together_are_refused():
    store = embstore.Store()
    with pytest.raises(InvalidArgumentError, match="not both"):
        store.create_table(TableSpec("t", 4), num_shards=2)
    with pytest.raises(TypeError, match="embedding_dim"):
        store.create_table("t")
    assert store.tables() == []
