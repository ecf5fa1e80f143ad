"""Training: the Criteo loader and shipped sample, the CTR models, the training loops, the demo and
its report; its modules, one job each: docs/architecture.md."""
