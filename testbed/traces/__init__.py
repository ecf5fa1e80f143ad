"""Traces: record the client frames of training batches as a pcap and replay them into the card,
with the replay's report (:mod:`.trace`). pcap files are written by :mod:`embnic.control.pcap`.
"""
