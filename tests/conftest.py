"""Shared by every test folder: pytest puts this file's folder (tests/) on ``sys.path`` (the
default ``prepend`` import mode), so helpers that several folders use live here as plain modules
(``drops.py``)."""
