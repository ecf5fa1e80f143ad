"""CLI error types: one line each, naming the fix."""
from __future__ import annotations

import click


class OperationalError(click.ClickException):
    """Something the user asked for could not be done (exit code 1)."""

    exit_code = 1


class NeedsRootError(OperationalError):
    """The command needs root (CAP_NET_ADMIN, DPDK EAL): exit code 2 — run it differently."""

    exit_code = 2
