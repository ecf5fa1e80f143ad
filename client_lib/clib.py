"""The C libraries the Python package builds beside the code that binds them, found and checked.

Two shared libraries ship inside the package, compiled by its build (``setup.py``: ``pip install .``,
``pip wheel .``, and in a checkout ``pip install -e .`` or ``make libs``):

* ``embnic.client_lib.libembnic_client`` — the client's round: plan, frames, send window, timers and
  loss recovery (sources ``client_lib/csrc/``), bound by :mod:`embnic.client_lib.native`; and the row
  store's updates (``client_lib/csrc/store.c``), bound by :mod:`embnic.client_lib.table_numerics`;
* ``embnic.testbed.server.libembnic_shard`` — the shard's intake and answer path (sources
  ``testbed/server/csrc/``, and the row store's ``client_lib/csrc/store.c`` it reads the rows with),
  bound by the shard's serving loop.

Both read the protocol headers of ``include/`` (``embnic_proto.h``, ``embnic_parse.h``), the ones the
card (``dataplane/``) reads. Each library carries the digest of the sources it was built from
(:func:`sources_digest`) and the protocol version it speaks (``embnic_lib_proto_version``): a library
built from other sources than those beside it (an edited checkout not rebuilt), or for another
protocol version, is refused with one line naming the rebuild command — there is no second path to
fall back to. ``EMBNIC_CLIENT_LIB`` / ``EMBNIC_SHARD_LIB`` point a process at another build of the same
library (tests use this for a library built for another protocol version).

This module imports nothing of embnic: ``setup.py`` loads it by path to compute the digest it bakes in.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

#: the command that rebuilds the libraries in a checkout (an installed wheel carries them built)
REBUILD = "pip install -e . (or: make libs)"
_HERE = Path(__file__).resolve().parent


class NativeLibraryError(RuntimeError):
    """A package C library is missing, does not load, or was built from other sources or for another
    protocol version than this package's (the message is one line naming the rebuild command)."""


@dataclass(frozen=True)
class NativeLib:
    """One of the package's C libraries: where it is built and from what.

    ``name`` is ``client`` (the client's round) or ``shard`` (the shard's intake and answer path);
    ``package_dir`` is the Python package folder the library is built into, ``stem`` the file name
    before the interpreter's extension suffix, ``sources`` the library's own C files and headers
    (relative to ``package_dir``), ``env`` the variable that may point at another build,
    ``include_dir`` the protocol headers it reads (``include/`` of a source checkout; absent from an
    installed wheel)."""

    name: str
    package_dir: Path
    stem: str
    sources: tuple[str, ...]
    env: str
    include_dir: Path = _HERE.parent / "include"

    @property
    def path(self) -> Path:
        """The library file loaded: ``$env`` if set, else ``<package_dir>/<stem><EXT_SUFFIX>``."""
        override = os.environ.get(self.env)
        if override:
            return Path(override)
        return self.package_dir / (self.stem + sysconfig.get_config_var("EXT_SUFFIX"))

    def source_files(self) -> list[Path]:
        """The files its digest covers: its own sources, then every header of ``include_dir``."""
        return [(self.package_dir / s).resolve() for s in self.sources] + sorted(self.include_dir.glob("*.h"))


def sources_digest(files: list[Path]) -> str:
    """SHA-256 (hex) over the files' names and bytes, in the order given.

    Raises OSError when a file cannot be read."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


#: the two libraries (their sources: setup.py compiles exactly these, in this order)
CLIENT = NativeLib("client", _HERE, "libembnic_client",
                   ("csrc/plan.c", "csrc/context.c", "csrc/table.c", "csrc/frames.c", "csrc/recovery.c", "csrc/round.c",
                    "csrc/store.c", "csrc/round.h", "csrc/store.h"), "EMBNIC_CLIENT_LIB")
#: the row store's C (client_lib/csrc/store.c) is compiled into both: the client library updates a
#: RowStore (LocalBackend's, a shard's), the shard library reads the same store in place
SHARD = NativeLib("shard", _HERE.parent / "testbed" / "server", "libembnic_shard",
                  ("csrc/intake.c", "csrc/answer.c", "../../client_lib/csrc/store.c", "csrc/send.c", "csrc/shard.h",
                   "../../client_lib/csrc/store.h"), "EMBNIC_SHARD_LIB")


def _checkout_digest(lib: NativeLib) -> str | None:
    """The digest of the sources beside the package, or None where they are not there (an installed
    wheel: the library was built with the package, nothing to compare)."""
    files = lib.source_files()
    if not lib.include_dir.is_dir() or not all(f.is_file() for f in files):
        return None
    return sources_digest(files)


def load(lib: NativeLib, proto_version: int, abi: tuple[str, int] | None = None) -> ctypes.CDLL:
    """Load ``lib`` and check that it was built from the sources beside it and speaks
    ``proto_version``; with ``abi`` = (function name, number), also that the library's ABI function
    returns that number (the binding's own tables: columns, header fields).

    Raises NativeLibraryError (one line, naming the file and the rebuild command) when the file is
    missing, does not load, or was built from other sources, for another protocol version or ABI."""
    return _load(lib, proto_version, abi)[0]


def _load(lib: NativeLib, proto_version: int, abi: tuple[str, int] | None = None) -> tuple[ctypes.CDLL, bool]:
    """:func:`load`, and whether the sources beside the package were there to compare with."""
    path = lib.path
    if not path.is_file():
        raise NativeLibraryError(f"embnic: the {lib.name} library {path} is not built: run {REBUILD}")
    try:
        cdll = ctypes.CDLL(str(path))
    except OSError as e:
        raise NativeLibraryError(f"embnic: the {lib.name} library {path} does not load ({e}): run {REBUILD}") from e
    try:
        cdll.embnic_lib_sources.restype = ctypes.c_char_p
        built_from = cdll.embnic_lib_sources().decode()
        built_version = int(cdll.embnic_lib_proto_version())
    except AttributeError as e:
        raise NativeLibraryError(f"embnic: {path} is not the embnic {lib.name} library built by this package: "
                                 f"run {REBUILD}") from e
    if built_version != proto_version:
        raise NativeLibraryError(f"embnic: {path} speaks protocol version {built_version}, this package "
                                 f"{proto_version}: run {REBUILD}")
    if abi is not None and getattr(cdll, abi[0])() != abi[1]:
        raise NativeLibraryError(f"embnic: {path} speaks ABI {getattr(cdll, abi[0])()}, not {abi[1]}: run {REBUILD}")
    want = _checkout_digest(lib) if not os.environ.get(lib.env) else None
    if want is not None and built_from != want:
        raise NativeLibraryError(f"embnic: {path} was built from other sources than {lib.package_dir / 'csrc'} "
                                 f"(edited since the build?): run {REBUILD}")
    return cdll, want is not None


def status(proto_version: int) -> list[dict]:
    """What each library is, where, and whether it loads: one dict per library with ``name``,
    ``path``, ``ok`` (bool) and ``detail`` (why not, or "built from the sources beside it" /
    "built with the installed package"). Never raises."""
    out = []
    for lib in (CLIENT, SHARD):
        try:
            beside = _load(lib, proto_version)[1]
        except NativeLibraryError as e:
            out.append({"name": lib.name, "path": str(lib.path), "ok": False, "detail": str(e)})
            continue
        where = "built from the sources beside it" if beside else "built with the installed package"
        out.append({"name": lib.name, "path": str(lib.path), "ok": True, "detail": where})
    return out
