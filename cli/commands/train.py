"""``embnic train``: train the CTR model with its embeddings on the cluster's shards."""
from __future__ import annotations

import errno
import json
import math

import click

from embnic.client_lib.config import load_config
from embnic.cli.commands.options import (FloatRange, OutPath, as_missing, as_operational, as_param, config_option,
                                         errors_as, model_option)
from embnic.control.errors import OperationalError


def _bind_error(e: OSError, me, config) -> str:
    """One line for a client socket that could not bind ``me.ip:me.port``, naming the fix."""
    where = f"cannot bind client {me.id} to {me.ip}:{me.port}"
    if e.errno == errno.EADDRNOTAVAIL:
        return (f"{where}: {me.ip} is not an address of this host (or network namespace); run train on client "
                f"{me.id}'s host (in the testbed: `ip netns exec <its namespace> embnic train ...`, as `testbed up` "
                f"prints), pick --client-id, or fix clients[id={me.id}] in {config}")
    if e.errno == errno.EADDRINUSE:
        return (f"{where}: address already in use (another client {me.id} running?); stop it "
                f"(ss -ulpn | grep :{me.port}), pick --client-id, or fix clients[id={me.id}] in {config}")
    return f"{where}: {e.strerror or e}; fix clients[id={me.id}] in {config}"


def _warn_if_trained(client, cfg, data, batch_size: int) -> tuple[int, int]:
    """Warn (one line on stderr) when the shards already hold updated rows that this run reads
    (:func:`~embnic.testbed.training.train.trained_rows`, one lookup round before step 1, not
    counted in the client's statistics). Returns (changed, read)."""
    from embnic.client_lib.stats import ClientStats
    from embnic.testbed.training.train import trained_rows

    changed, read = trained_rows(client, cfg, data, batch_size)
    client.stats = ClientStats()  # the probe is no part of the run's traffic
    if changed:
        click.echo(f"warning: the shards already hold trained rows: {changed} of the {read} rows step 1 reads differ "
                   "from their initial values (an earlier run's updates?); this run continues from them — restart "
                   "the shards for a run from scratch", err=True)
    return changed, read


@click.command("train")
@config_option(example="examples/cluster.toml")
@click.option("--data", "data_path", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Criteo TSV (Kaggle train.txt layout), plain or gzip/bzip2/xz. Default: the sample shipped "
                   "with embnic.")
@click.option("--steps", type=click.IntRange(min=1), default=50, show_default=True, help="Training steps.")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True, help="Samples per step.")
@click.option("--client-id", type=int, default=None, help="This client's id (default: the config's first client).")
@click.option("--local", is_flag=True, help="Keep the tables in this process (the reference run) instead of the shards.")
@click.option("--max-rows", type=click.IntRange(min=2), default=None, help="Read at most this many rows of --data.")
@click.option("--valid-fraction", type=FloatRange(0.01, 0.99), default=0.2, show_default=True,
              help="Last fraction of rows held out for the AUC.")
@click.option("--json-out", type=OutPath("file", "train.json"), default=None,
              help="Also write losses, AUC and client counters to this JSON file (its folder must exist).")
@model_option
def train(config, data_path, steps, batch_size, client_id, local, max_rows, valid_fraction, json_out, model):
    """Train a CTR model on Criteo data; every embedding row is looked up from and updated on
    the parameter-server shards (directly, or through the card when the config's [card] is
    enabled). Prints the loss of every step and the final AUC.

    The shards keep their rows between runs: a run against shards that already hold updated
    rows continues from them and says so in a warning line (docs/cli.md).

    \b
    Example:
      embnic server --shard 0 -c examples/cluster.toml &
      embnic server --shard 1 -c examples/cluster.toml &
      embnic train -c examples/cluster.toml --steps 40
      embnic train -c examples/cluster.toml --steps 40 --model dlrm
    """
    from embnic.testbed.training.train import load_training_data, trainer

    with errors_as((ImportError, as_missing(f"--model {model}: "))):  # its message names the extra to install
        run_train = trainer(model)
    cfg = load_config(config)
    from embnic.client_lib.client import EmbnicError, EmbeddingClient
    from embnic.client_lib.local import LocalBackend
    from embnic.testbed.training.criteo import CriteoFormatError

    if client_id is None:
        client_id = cfg.clients[0].id
    elif client_id not in {c.id for c in cfg.clients}:
        raise click.BadParameter(f"no client {client_id} in {config} (clients: "
                                 f"{', '.join(str(c.id) for c in cfg.clients)})", param_hint="--client-id")
    # no (labelled) Criteo TSV: another --data is the fix (exit 2)
    with errors_as((CriteoFormatError, as_param("--data")),
                   (OSError, lambda e: OperationalError(f"cannot read training data: {e}"))):
        tr, va = load_training_data(cfg, data_path, valid_fraction=valid_fraction, max_rows=max_rows)
    click.echo(f"training on {len(tr.labels)} rows, evaluating on {len(va.labels)}; "
               f"{'in-process tables' if local else f'{len(cfg.shards)} shards'}")

    def progress(step, loss):
        click.echo(f"step {step + 1:5d}  loss {loss:.6f}")

    client = held = None
    try:  # a ValueError: the model does not fit the config (e.g. DLRM with tables of several dims)
        with errors_as((EmbnicError, as_operational), (ValueError, lambda e: click.UsageError(f"{config}: {e}"))):
            if local:
                backend = LocalBackend(cfg)
            else:
                with errors_as((OSError, lambda e: OperationalError(_bind_error(e, cfg.client(client_id), config)))):
                    client = backend = EmbeddingClient(cfg, client_id)
                held = _warn_if_trained(client, cfg, tr, batch_size)
            res = run_train(cfg, tr, steps=steps, batch_size=batch_size, backend=backend, eval_data=va,
                            progress=progress)
    finally:
        if client is not None:
            client.close()
    auc = ("n/a (no held-out rows)" if res.auc is None else
           "n/a (held-out rows have one class only)" if math.isnan(res.auc) else f"{res.auc:.4f}")
    ev = f"{res.eval_loss:.6f}" if res.eval_loss is not None else "n/a"
    click.echo(f"final AUC {auc}  eval loss {ev}  dedup ratio {res.dedup_ratio:.3f}")
    if client is not None:
        s = client.stats
        click.echo(f"messages {s.messages_sent}  frames {s.frames_sent}  rounds {s.rounds}  "
                   f"retransmits {s.retransmits}")
    if json_out:
        out = {"model": model, "steps": steps, "loss": res.loss,
               "rows_already_trained": None if held is None else {"changed": held[0], "read": held[1]},
               "auc": None if res.auc is None or math.isnan(res.auc) else res.auc, "eval_loss": res.eval_loss,
               "dedup_ratio": res.dedup_ratio,
               "client": client.stats.as_dict() if client is not None else None}
        with open(json_out, "w") as f:
            json.dump(out, f, indent=2)
