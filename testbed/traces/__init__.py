"""Traces: record the client frames of training batches as a pcap (:mod:`.trace` ``record``) and
replay them into the card (``replay``); :mod:`.capture` reads a veth, :mod:`.replay_report`
writes the replay's report. pcap files are written by :mod:`embnic.control.pcap`.
"""
