"""Linearizability checking of histories recorded against a real plane.

``history`` records what clients saw (each operation's call and return on one monotonic
clock, its input and output) while faults are injected; ``checker`` builds and runs the Go
program beside this file (``main.go``), which checks the history with Porcupine against the
model of a conversation the REST API promises (an append-only log with gapless seqs and
idempotency keys, read whole or by its last seq). A checker written by outsiders, not by us:
what our own simulator's checker does not model, it still catches.
"""
