"""The ``convplane`` command line."""
