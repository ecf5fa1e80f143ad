"""Traces: record the client frames of training batches as a pcap (:mod:`.trace` ``record``, its
``Capture`` reads a veth) and replay them into the card (``replay``); :mod:`.replay_report`
writes the replay's report. pcap files are written by :mod:`embnic.control.pcap`.
"""
