"""CLI error types: one line each, naming the fix."""
from __future__ import annotations

import click


class OperationalError(click.ClickException):
    """Something the user asked for could not be done (exit code 1)."""

    exit_code = 1
