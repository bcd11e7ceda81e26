"""The benchmarks: each prints its figures and the floor it compares against.

Run from the project's root as ``.venv/bin/python -m tools.benchmark.NAME``
(the Makefile's ``bench-*`` targets do); lib/ holds what they share.
"""
