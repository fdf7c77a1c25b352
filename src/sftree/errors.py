"""Errors that end a command with a clear message (no traceback) instead of a crash."""


class SftreeError(Exception):
    """A user-facing error: the message names the file or field that is wrong."""


class InputError(SftreeError):
    """Bad input data (snapshot folder, metadata, attempt record, tree file, config)."""


class TeacherUnavailable(SftreeError):
    """The Teacher server cannot be reached or keeps failing past the retry budget."""


class DiskFull(SftreeError):
    """No room left (ENOSPC, EDQUOT) where an output is written: the message names the file, and nothing of it
    was written (the file is as it was). Never a fault of the data: the command stops, the rerun continues."""
