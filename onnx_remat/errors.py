"""Errors that onnx-remat reports to a user as one line, with the exit status the CLI uses.

Library code raises these for anything a user can fix (bad input, a pattern that matches
nothing, a missing runtime). The CLI turns them into ``error: <message>`` on stderr and the
exit status below, never a traceback. Anything else escaping is a bug in onnx-remat.
"""

from __future__ import annotations


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name if it has none)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class RematError(Exception):
    """A problem with the user's input or request. CLI exit status 1."""

    exit_code = 1


class ForwardOnlyGraph(RematError):
    """The model has no gradient nodes: it is not a training graph. CLI exit status 1."""

    exit_code = 1


class RegressionError(RematError):
    """A check found a regression or a gradient mismatch. CLI exit status 1."""

    exit_code = 1


class UsageError(RematError):
    """Command-line arguments that do not fit together. CLI exit status 2."""

    exit_code = 2


class EnvironmentProblem(RematError):
    """The environment cannot do what was asked: runtime missing, no GPU. CLI exit status 3."""

    exit_code = 3
