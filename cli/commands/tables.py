"""``embnic tables export|import``: trained embedding tables out of and into the shards' directories."""
from __future__ import annotations

import json
from typing import Callable

import click

from embnic.client_lib.config import load_config
from embnic.cli.commands.options import OutPath, as_operational, config_option, errors_as, json_option
from embnic.control.errors import MissingDependencyError, OperationalError, UsageError


def store_error(e: Exception):
    """The CLI error for a disk tier that cannot start (``stores.StoreSetupError``): its missing
    dependency (exit 2) or its directory (exit 1)."""
    from embnic.testbed.server.stores import StoreDependencyError

    if isinstance(e, StoreDependencyError):
        return MissingDependencyError(str(e), "rocksdict")
    return OperationalError(str(e))


@click.group("tables")
def tables():
    """Take trained tables out of the shards' checkpoint directories, or seed shards from a file.

    Files are safetensors (docs/server.md, "Tables in and out"): whole tables as TorchRec's
    EmbeddingBagCollection loads them (--layout torchrec), or the updated rows by id (--layout ids).

    \b
    Examples:
      embnic tables export -c examples/cluster.toml --from /var/lib/embnic --out tables.safetensors
      embnic tables import -c examples/cluster.toml tables.safetensors --into /var/lib/embnic-new
    """


def _tables_errors(os_message: Callable[[OSError], str]):
    """The errors of a tables export or import as the CLI's; an ``OSError`` worded by ``os_message``."""
    from embnic.testbed.server.stores import StoreSetupError
    from embnic.testbed.server.tables_io import TablesFileError

    return errors_as((TablesFileError, lambda e: UsageError(str(e))), (StoreSetupError, store_error),
                     (OSError, lambda e: OperationalError(os_message(e))))


@tables.command("export")
@config_option(example="examples/cluster.toml")
@click.option("--from", "src", type=click.Path(file_okay=False, exists=True), required=True,
              help="The shards' --checkpoint-dir (read as a restart would: latest checkpoint + log; nothing changes).")
@click.option("--out", type=OutPath("file", "tables.safetensors"), required=True,
              help="File to write (safetensors); its folder must exist.")
@click.option("--layout", type=click.Choice(["torchrec", "ids"]), default=None,
              help="torchrec: whole tables as embedding_bags.<table>.weight (needs rows); ids: updated rows by id "
                   "with their optimizer state. Default: torchrec when every table has rows.")
def export(config, src, out, layout):
    """Gather every shard's rows from their directory into one file.

    \b
    Example:
      embnic tables export -c examples/cluster.toml --from /var/lib/embnic --out tables.safetensors
    """
    from embnic.testbed.server.durability import DurabilityError
    from embnic.testbed.server.tables_io import export_tables

    cfg = load_config(config)
    with _tables_errors(lambda e: f"cannot write {out}: {e.strerror or e}"), \
            errors_as((DurabilityError, as_operational)):
        rep = export_tables(cfg, src, out, layout)
    click.echo(f"wrote {out} ({rep['layout']}): " + ", ".join(f"{k} {v} rows" for k, v in rep["tables"].items()))


@tables.command("import")
@config_option(example="examples/cluster.toml")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("--into", "dst", type=OutPath("dir", "embnic-tables"), required=True,
              help="Directory to initialise, created if missing (DIR/shard-<id>/ckpt-0.npz per shard); serve with --restore DIR.")
@json_option
def import_(config, file, dst, as_json):
    """Initialise every shard's directory from a tables file (each shard gets the rows it owns).

    \b
    Example:
      embnic tables import -c examples/cluster.toml tables.safetensors --into /var/lib/embnic
      embnic server --shard 0 -c examples/cluster.toml --restore /var/lib/embnic
    """
    from embnic.testbed.server.tables_io import import_tables

    cfg = load_config(config)
    with _tables_errors(lambda e: f"{e.filename or file}: {e.strerror or e}"):
        rep = import_tables(cfg, file, dst)
    if as_json:
        click.echo(json.dumps(rep))
    else:
        click.echo(f"initialised {dst} from {file} ({rep['layout']}): "
                   + ", ".join(f"shard {k} {v} rows" for k, v in rep["rows"].items()))
