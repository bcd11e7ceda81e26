"""The crash campaign: servers sharing one capped disk store are SIGKILLed at
random moments, and the store is checked after every kill.

In the spirit of SQLite's crash tests. What runs:

- ``worker.py``: one "server" of the store. It is the disk tier exactly as
  vLLM's engine core builds it (``DiskTier``: the real start-up scan,
  reconcile and eviction to the cap, the real I/O threads, ledger and block
  files on a real file system), driven by a loop that does what vLLM's
  offloading scheduler does with it: look blocks up, load the hits into rows
  of its primary tier, store the misses. Every block's bytes are a function
  of its key, so every restore is checked byte for byte against what any
  server stored (the disk tier's equivalent of "the tokens of an L1 hit").
  What it leaves out is the model: the KV bytes of a real engine are checked
  by the end-to-end tests (tests/e2e/test_shared_store.py restores across
  servers and restarts against an L1 hit of the same prompt).
- ``driver.py``: starts the workers (forked from the driver, which has
  imported the tier already, so a restart costs milliseconds, not vLLM's
  import time), and in each round SIGKILLs one at a random moment, either
  under traffic (mid-store, mid-eviction, mid-load) or during its start-up
  (mid-scan, mid-reconcile), restarts it, freezes every worker (SIGSTOP: the
  store then holds exactly what a power cut would leave) and checks it.
- ``invariants.py``: what must hold then, whatever the moment of the kill.
- ``disk_full.py``: for ``--full-disk-share``, the store on a small tmpfs
  of the campaign's own, filled to its last byte in a share of the rounds.
- ``__main__.py``: ``python -m tools.crash_campaign``, printing
  ``kills=N rounds=N violations=N``; docs/faults.md ("The crash campaign") has the command.

Nothing crosses a process boundary but signals, one "ready" byte on a pipe
per start, the files of the store, and each worker's log.
"""
