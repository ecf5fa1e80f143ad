"""``embnic demo``: the main job — train on the shipped Criteo sample through the card (testbed/training/demo.py)."""
from __future__ import annotations

import click

from embnic.cli.commands.options import (FloatRange, OutPath, as_missing, as_param, card_option, check_name_param,
                                         errors_as, model_option, needs_root, pmd_option, sigterm_as_interrupt)


@click.command("demo")
@click.option("--steps", type=click.IntRange(min=1), default=60, show_default=True, help="Training steps.")
@click.option("--out", "out", type=OutPath("dir", "demo"), default="out/demo", show_default=True,
              help="Directory for report.json and the PNG plots (created if missing).")
@click.option("--config", "-c", "config", type=click.Path(dir_okay=False, exists=True), default=None,
              envvar="EMBNIC_DEMO_CONFIG", help="Cluster config with a [card] (default: examples/testbed.toml).")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True, help="Samples per step.")
@click.option("--data", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Criteo TSV (Kaggle train.txt layout). Default: the sample shipped with embnic.")
@click.option("--name", default="embdemo", show_default=True, callback=check_name_param,
              help="Testbed name (namespace/interface prefix, 1-8 letters/digits).")
@click.option("--loss", type=FloatRange(0, 100), default=0.0, help="Fault: % of frames lost on every link.")
@click.option("--reorder", type=FloatRange(0, 100), default=0.0, help="Fault: % of frames reordered.")
@click.option("--duplicate", type=FloatRange(0, 100), default=0.0, help="Fault: % of frames duplicated.")
@click.option("--netem-backend", type=click.Choice(["auto", "tc", "bpf", "user"]), default="auto", show_default=True,
              help="How faults are injected (see `embnic testbed netem --help`).")
@click.option("--kill-shard", type=int, default=None, metavar="ID",
              help="Fault: kill this shard's server during the run (the run must fail naming it).")
@click.option("--kill-at-step", type=int, default=None, metavar="K",
              help="Step after which --kill-shard strikes: 1..STEPS-1 (default 1).")
@click.option("--restart", is_flag=True,
              help="With --kill-shard: the killed shard is restarted from its log and checkpoints at once; the run "
                   "must complete with the fault-free losses and tables.")
@click.option("--checkpoint-every", type=click.IntRange(min=0), default=16, show_default=True,
              help="With --restart: logged updates between a shard's checkpoints.")
@click.option("--no-table-check", is_flag=True, help="Skip reading every updated row back through the card.")
@click.option("--all-clients", is_flag=True, help="Every other client of the config looks up its own batches "
                                                  "through the card while the first one trains (lookups only).")
@click.option("--progress/--no-progress", default=None, help="Progress bars (default: when stderr is a terminal).")
@model_option
@card_option
@pmd_option
@needs_root("demo")
def demo(config, loss, reorder, duplicate, no_table_check, **opts):
    """Train the CTR model on the shipped Criteo sample with every embedding lookup and update
    passing through the card, in a namespace testbed it brings up and down. Needs root.

    The per-step losses through the card must match the same training with in-process tables
    within 1e-6, and the final tables must be identical. Writes OUT/report.json, OUT/loss.png and
    OUT/latency_cdf.png, also when training fails (exit 1 naming the node that died).

    \b
    Examples:
      sudo embnic demo                       # what `make demo` runs
      sudo embnic demo --steps 10 --out /tmp/demo
      sudo embnic demo --model dlrm --steps 10    # TorchRec's DLRM (embnic[torch])
      sudo embnic demo --loss 1 --reorder 5 --duplicate 1    # faults on every link
      sudo embnic demo --steps 10 --kill-shard 1 --kill-at-step 3   # fails at step 4, naming shard 1
      sudo embnic demo --steps 10 --kill-shard 1 --kill-at-step 3 --restart   # SIGKILL, restore, same result
      sudo embnic demo --batch-size 4096 --all-clients   # every client loads the card (state_full stays 0)
      sudo embnic demo --steps 10 --target bmv2     # the P4 card on BMv2 (simple_switch on PATH)
      sudo embnic demo --steps 10 --pmd af_xdp      # the card on net_af_xdp (make demo PMD=af_xdp)
    """
    from embnic.testbed.training import demo as D
    from embnic.testbed.training.criteo import CriteoFormatError
    from embnic.testbed.net.netem import Impairment, loss_only

    model = opts["model"]
    opts = D.DemoOptions(check_tables=not no_table_check, **opts)  # every other option is a DemoOptions field
    if config is not None:
        opts.config = config
    if loss or reorder or duplicate:
        opts.impairment = Impairment(loss, reorder, duplicate)
        if opts.netem_backend == "bpf" and not loss_only(opts.impairment):
            raise click.BadParameter("the bpf backend only drops frames (--loss); --reorder and --duplicate need "
                                     "--netem-backend user (or tc where the kernel has netem)",
                                     param_hint="--netem-backend")
    # --data no Criteo TSV: read before the testbed comes up; --model dlrm without embnic[torch]: the
    # message says what to install
    with sigterm_as_interrupt(), errors_as(
            (D.DemoUsageError, lambda e: click.BadParameter(str(e), param_hint=e.param)),
            (CriteoFormatError, as_param("--data")), (ImportError, as_missing(f"--model {model}: "))):
        D.run_demo(opts, log=click.echo)
