"""Benchmarks (benchmark/) and the harness they share with the tests (harness/).

Nothing under vllm_uma/ imports from here (tests/unit/test_layout.py).
"""
