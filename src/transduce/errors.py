"""User-facing errors. The CLI prints any :class:`TransduceError` as one line (no traceback) and exits with 2.

Library code raises a subclass whose message names the file, line or field at fault.
"""


class TransduceError(Exception):
    """Base of every error caused by the user's input rather than by a bug."""


class DataError(TransduceError, ValueError):
    """Bad corpus input: mismatched files, invalid UTF-8, empty data, an unusable vocabulary size."""


class CheckpointError(TransduceError, ValueError):
    """A checkpoint that is missing, corrupt, truncated or does not match the model or vocabulary."""


class InteropError(TransduceError, ValueError):
    """A model that another toolkit's format cannot express, or a foreign model this version cannot read."""
