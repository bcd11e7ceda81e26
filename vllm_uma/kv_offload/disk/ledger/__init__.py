"""L3 shared bookkeeping: one SQLite ledger per store, for every server on it.

Several servers (engine-core processes, same or different models) may share
one root_dir. The block files hold the KV; the ledger,
``root_dir/.noindex/ledger.sqlite3``, is what the servers agree on:

- which block files exist or are being written, their sizes and their LRU
  order (``last_use``), so that one cap holds for the directory whoever
  stores, and a victim is the least recent block of any server;
- a change feed (table ``changes``): a block stored by one server is found
  by the others, a block evicted by one leaves their indexes (feed.py).

Who calls it, all in engine-core processes and never on the scheduler
thread: the I/O threads reserve, commit, abort and forget blocks (one short
transaction each; the files a reservation evicts are unlinked after it, and
their rows released in a second one); the feed thread writes batched
touches and reads changes; start-up reconciles the ledger with the files
(startup.py); the ``kv-store`` admin command forgets what it deletes.

    db.py        the SQLite file: schema, a connection per thread, transactions
    blocks.py    ``Ledger``: what stores, deletes and the feed do to the rows
    room.py      making room under the cap: victims, least recent first
    feed.py      the feed thread: our touches out, other servers' changes in
    startup.py   open the ledger (a damaged one moved aside), reconcile it

Why SQLite in WAL mode: it ships with Python, readers never wait for the
writer, writers queue on one lock (with a timeout), and a process killed in
a transaction leaves nothing half-done. WAL shares memory between the
processes, so the store must be on a local filesystem (the docs say why).

Invariants, at every commit:
- ``meta.used`` is the sum of ``blocks.size``, rows being written and
  deleted included; ``meta.deleting`` the sum over rows being deleted;
- after a reservation ``used - deleting`` <= the reserving server's cap
  (victims stay counted until their files are gone; servers on one store
  should give the same cap; if not, each store obeys its own);
- a row being written (WRITING) is never a victim; one whose writer's
  process is gone, or that is over an hour old, is reclaimed when room is
  short (its temp file is the start-up scan's to remove);
- a victim stays in the ledger, counted and its name taken, as "being
  deleted" (DELETING) until its file is unlinked: the unlink happens outside
  the write lock, and no store can land under the name before it.
"""
