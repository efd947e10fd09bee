"""Routing policies: small, synchronous, pure plugins that rank backends for one request.

A policy is a pipeline (see ``pipeline.py``): filters shrink the candidate set, weighted
scorers give each survivor a number in [0, 1], and a picker turns the scores into a ranked
list whose head serves the request and whose tail is the failover order.
Nothing here does I/O or imports from ``router``, ``replay`` or ``emulator``.
"""
