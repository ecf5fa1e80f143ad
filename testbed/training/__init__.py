"""Training: the Criteo loader and shipped sample, the CTR model, the training loop, the demo and its report."""
