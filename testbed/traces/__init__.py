"""Traces: record the client frames of training batches as a pcap and replay them into the card."""
