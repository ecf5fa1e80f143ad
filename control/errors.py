"""Errors of the control plane's library code (targets, control socket, build info, testbed).

Plain exception classes, no click: every one carries a :attr:`~ControlError.category`
(``usage``, ``operational``, ``needs-root``, ``missing-dependency``) that says what the user has
to do; the CLI maps it to an exit code in one place (:func:`embnic.cli.main.to_click`, docs/cli.md
"Errors and exit codes"). Messages are one line and name the fix. A library module raises the
class of its category (or a subclass of it); a subclass may move to another category by setting
``category``.
"""
from __future__ import annotations

import shlex

USAGE = "usage"
OPERATIONAL = "operational"
NEEDS_ROOT = "needs-root"
MISSING_DEPENDENCY = "missing-dependency"

#: category → process exit code of the ``embnic`` command
EXIT_CODES = {USAGE: 2, OPERATIONAL: 1, NEEDS_ROOT: 2, MISSING_DEPENDENCY: 2}


class ControlError(Exception):
    """Base of the control plane's errors; ``category`` is one of :data:`EXIT_CODES`' keys.

    Args:
        message: one line naming the problem and the fix.
    """

    category: str = OPERATIONAL

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    @property
    def exit_code(self) -> int:
        """The exit code of the category (2 usage / needs root / missing dependency, 1 operational)."""
        return EXIT_CODES[self.category]

    def __str__(self) -> str:
        return self.message


class UsageError(ControlError):
    """The request is wrong: a bad option or combination, an unknown name, a file that is no binary (exit 2).

    Args:
        message: what is wrong and what to give instead.
        param: the parameter it concerns (``"vdevs"``, ``"config"``, ...), if one; the CLI may use it.
    """

    category = USAGE

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def split_args(value: str, what: str, *, fix: str = "close the quote, or escape it with a backslash",
               error: type[Exception] | None = None) -> list[str]:
    """``value`` split like a shell (:func:`shlex.split`) for the setting ``what`` (``--eal-args``,
    ``EMBNIC_EAL_ARGS``, a config field, ...): the one place every argument-list setting is split.

    Raises:
        ``error`` (default :class:`UsageError`, exit 2) naming ``what``, the value and ``fix`` when
        it does not split (an unclosed quote, a trailing backslash).
    """
    try:
        return shlex.split(value)
    except ValueError as e:
        raise (error or UsageError)(f"{what} {value!r} is not a shell-quoted argument list ({str(e).lower()}): "
                                    f"{fix}") from None


class NoSuchEntryError(UsageError):
    """A route or client delete named an entry the card does not have (exit 2).

    Args:
        kind: ``"route"`` or ``"client"``.
        id: the shard id (route) or client id it named.
    """

    def __init__(self, kind: str, id: int):
        what = "route for shard" if kind == "route" else "client"
        super().__init__(f"the card has no {what} {id}: `embnic {kind} list` shows what it has", param=kind)
        self.kind = kind
        self.id = id


class OperationalError(ControlError):
    """Something the user asked for could not be done (exit 1)."""

    category = OPERATIONAL


class NeedsRootError(ControlError):
    """The operation needs root (CAP_NET_ADMIN, DPDK EAL): exit 2 — run it differently."""

    category = NEEDS_ROOT


class MissingDependencyError(ControlError):
    """A program or Python package the operation needs is not installed (exit 2).

    Args:
        message: what is missing and how to install it.
        dependency: its name (``"simple_switch"``, ``"p4c"``, ``"dpdk-testpmd"``, ``"torch"``).
    """

    category = MISSING_DEPENDENCY

    def __init__(self, message: str, dependency: str | None = None):
        super().__init__(message)
        self.dependency = dependency


def require_program(name: str, install: str) -> str:
    """The path of program ``name`` on PATH.

    Args:
        name: the program (``"tcpreplay"``, ``"dpdk-testpmd"``, ``"simple_switch"``, ``"p4c"``).
        install: how to get it, e.g. ``"apt-get install tcpreplay"``.
    Raises:
        MissingDependencyError: ``"<name> is not installed: <install>"`` (exit 2).
    """
    import shutil

    path = shutil.which(name)
    if path is None:
        raise MissingDependencyError(f"{name} is not installed: {install}", dependency=name)
    return path
