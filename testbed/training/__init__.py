"""Training: the Criteo loader and shipped sample, the CTR models, the training loops, the demo and its report.

Modules:

* ``criteo`` — the Criteo TSV loader, the shipped sample, which table each feature reads (``feature_tables``)
* ``fm_model`` — the factorisation-machine CTR model in numpy (forward, backward, SGD of the dense parameters)
* ``result`` — ``TrainResult``, what every trainer returns
* ``train`` — the FM training loop over a backend, evaluation, ``trainer(model)``, ``load_training_data``
* ``dlrm`` — TorchRec's DLRM with its tables on a backend (``--model dlrm``)
* ``dlrm_workers`` — several DLRM workers under torchrun (``torchrun -m embnic.testbed.training.dlrm_workers``)
* ``demo`` — the main job: train through the card, check against the in-process run
* ``demo_options`` — ``DemoOptions`` and the demo's defaults
* ``demo_measure`` — the demo's reference run, probes, other clients' load, table read-back
* ``demo_report`` — the demo's report.json, plots and summaries
* ``report`` — report helpers of the demo and trace replay: JSON report, PNG plots, progress bar, summary
"""
