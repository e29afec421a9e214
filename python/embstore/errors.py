"""Exception classes raised by embstore.

Every error derives from :class:`EmbstoreError` and also from the built-in exception that fits,
so ``except ValueError`` (or ``KeyError``, ``OSError``, ``TypeError``) keeps working for code
that does not know embstore's classes.

========================  ====================  ==================================================
class                     also a                raised when
========================  ====================  ==================================================
InvalidArgumentError      ValueError            an argument's value is out of range
ShapeError                ValueError            shapes or lengths disagree (ids vs grads, dim)
DTypeError                TypeError             an array has the wrong dtype (float ids, …)
NonFiniteError            ValueError            a gradient or value is NaN or infinite
TableNotFoundError        KeyError              no table has that name
TableExistsError          ValueError            a table with that name exists already
KeyNotFoundError          KeyError              ``lookup(on_miss="error")`` meets an unknown id
StorageError              OSError               a file cannot be read or written
CorruptionError           StorageError          a file fails its checks (magic, checksum, length)
NoSpaceError              StorageError          the disk is full; nothing acknowledged is lost
StoreLockedError          StorageError          the store directory is open in another process
StoreClosedError          StorageError          a call on a closed store or a handle of one
NotFoundError             FileNotFoundError     a path the call names does not exist
UnsupportedFormatError    StorageError          a file was written by a newer format version
CapacityError             MemoryError           memory for rows or an index cannot be had
NotCopyableError          TypeError             pickling or copying an object that holds a table
DistributedError          RuntimeError          another process of the job failed, or died
========================  ====================  ==================================================
"""


class EmbstoreError(Exception):
    """Base class of every embstore error."""


class InvalidArgumentError(EmbstoreError, ValueError):
    """An argument has a value the call cannot accept (e.g. a payload of 2**52 or more)."""


class ShapeError(EmbstoreError, ValueError):
    """Array shapes or lengths do not match (e.g. 10 ids but 9 gradient rows)."""


class DTypeError(EmbstoreError, TypeError):
    """An array has a dtype the call cannot take (e.g. float ids)."""


class NonFiniteError(EmbstoreError, ValueError):
    """A gradient or value is NaN or infinite; nothing was written."""


class TableNotFoundError(EmbstoreError, KeyError):
    """No table has the given name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


class TableExistsError(EmbstoreError, ValueError):
    """A table with the given name exists already."""


class KeyNotFoundError(EmbstoreError, KeyError):
    """An id has no row and the call asked for an error on a miss."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StorageError(EmbstoreError, OSError):
    """A file could not be read or written."""


class CorruptionError(StorageError):
    """A file is not what it claims to be: bad magic, checksum mismatch, truncated."""


class NoSpaceError(StorageError):
    """The disk is full (or over quota). Nothing acknowledged was lost; the store stays readable
    and writing (``flush``) succeeds again once space is freed."""


class StoreLockedError(StorageError):
    """The store directory is open in another process (one process opens a directory at a
    time)."""


class StoreClosedError(StorageError):
    """The store was closed (``Store.close()`` or the end of its ``with`` block): it and every
    handle of its tables take no more calls. Open the store again for new handles."""


class NotFoundError(StorageError, FileNotFoundError):
    """A file or directory the call names does not exist (a checkpoint path with a typo)."""


class UnsupportedFormatError(StorageError):
    """A store, checkpoint or file was written by a newer format version than this embstore
    reads."""


class UnavailableError(EmbstoreError, ConnectionError):
    """No server could answer: none reachable, none holding a complete version of the table, or
    the call's deadline passed. Retrying later may succeed."""


class RollingBackError(UnavailableError):
    """The model is being rolled back to a healthy state: its training writes are stopped until
    the rollback ends. Retry after it (``embstore model status`` says when it is healthy)."""


class PermissionDeniedError(EmbstoreError, PermissionError):
    """A server refused the call: no token, a wrong one, or a read-only token for an admin
    call."""


class CapacityError(EmbstoreError, MemoryError):
    """A structure would need more memory than can be addressed or allocated."""


class NotCopyableError(EmbstoreError, TypeError):
    """An object that holds a table by reference (an ``embstore.torch`` module) cannot be
    pickled or copied: the copy could only share the table's rows. Save its ``state_dict()``
    or the table (``Table.save``) instead."""


class DistributedError(EmbstoreError, RuntimeError):
    """A call of a distributed store failed on another process of the job (its rank and error
    are named; that process raised its own error), or a peer did not answer within the timeout
    (it probably died)."""


__all__ = [
    "CapacityError",
    "CorruptionError",
    "DTypeError",
    "DistributedError",
    "EmbstoreError",
    "InvalidArgumentError",
    "KeyNotFoundError",
    "NonFiniteError",
    "NotCopyableError",
    "NotFoundError",
    "PermissionDeniedError",
    "RollingBackError",
    "ShapeError",
    "StorageError",
    "StoreClosedError",
    "TableExistsError",
    "TableNotFoundError",
    "UnavailableError",
]
