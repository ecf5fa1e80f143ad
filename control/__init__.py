"""The embnic command line and pipeline targets."""
