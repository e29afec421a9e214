"""Exception classes raised by embstore.

Every error derives from :class:`EmbstoreError` and also from the built-in exception that fits,
so ``except ValueError`` keeps working for code that does not know embstore's classes.
"""


class EmbstoreError(Exception):
    """Base class of every embstore error."""


class InvalidArgumentError(EmbstoreError, ValueError):
    """An argument has a value the call cannot accept (e.g. a payload of 2**52 or more)."""


class ShapeError(EmbstoreError, ValueError):
    """Array shapes or lengths do not match (e.g. 10 keys but 9 payloads)."""


class CapacityError(EmbstoreError, MemoryError):
    """A structure would need more memory than can be addressed or allocated."""


__all__ = ["CapacityError", "EmbstoreError", "InvalidArgumentError", "ShapeError"]
