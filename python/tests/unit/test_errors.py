"""The one mapping from native error kinds to Python exception classes, row by row.

Every kind the Rust side can return is raised through the bindings' mapping; the test asserts the
exact class, that it is an ``EmbstoreError``, the built-in it also derives from, and the message.
A kind added in Rust fails ``test_every_kind_has_a_row`` until it gets a row here.
"""

from __future__ import annotations

import pytest

from embstore import _native, errors

# kind -> (class, the built-in that class also is)
EXPECTED: dict[str, tuple[type[errors.EmbstoreError], type[BaseException]]] = {
    "InvalidArgument": (errors.InvalidArgumentError, ValueError),
    "ShapeMismatch": (errors.ShapeError, ValueError),
    "TableNotFound": (errors.TableNotFoundError, KeyError),
    "TableExists": (errors.TableExistsError, ValueError),
    "KeyNotFound": (errors.KeyNotFoundError, KeyError),
    "NonFinite": (errors.NonFiniteError, ValueError),
    "Corruption": (errors.CorruptionError, OSError),
    "Io": (errors.StorageError, OSError),
    "Capacity": (errors.CapacityError, MemoryError),
    "NoSpace": (errors.NoSpaceError, OSError),
    "Locked": (errors.StoreLockedError, OSError),
    "Unsupported": (errors.UnsupportedFormatError, OSError),
    "Unavailable": (errors.UnavailableError, ConnectionError),
    "RollingBack": (errors.RollingBackError, ConnectionError),
    "Closed": (errors.StoreClosedError, OSError),
    "NotFound": (errors.NotFoundError, FileNotFoundError),
    "PermissionDenied": (errors.PermissionDeniedError, PermissionError),
    # the cache's unknown policy / codec / table id: a bad argument
    "UnknownName": (errors.InvalidArgumentError, ValueError),
    # the cache's backing store failed to read rows
    "Backing": (errors.StorageError, OSError),
}


def test_every_kind_has_a_row():
    assert sorted(_native._error_kinds()) == sorted(EXPECTED)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_kind_raises_its_class(kind):
    cls, builtin = EXPECTED[kind]
    message = f"a {kind.lower()} error: exact text"
    with pytest.raises(cls) as info:
        _native._raise_error(kind, message)
    # the exact class, not a subclass (CorruptionError is also a StorageError)
    assert type(info.value) is cls
    assert isinstance(info.value, errors.EmbstoreError)
    assert isinstance(info.value, builtin)
    assert str(info.value).strip("'") == message


def test_unknown_kind_is_an_invalid_argument():
    with pytest.raises(errors.InvalidArgumentError, match="unknown error kind"):
        _native._raise_error("NoSuchKind", "x")
