"""Benchmarks: programs, not tests. Run each from the repository root as a module
(``.venv/bin/python -m bench.append``, ...); each prints ratios against a peer measured in the
same run, its last line JSON. Results and commands: ``bench/RESULTS.md``."""
