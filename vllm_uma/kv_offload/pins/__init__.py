"""Pins: prefixes a user keeps in the lower tiers, for a time or until unpinned.

A pin names the full blocks of one prompt (its offload keys, in prefix order)
in one namespace, with an expiry. While it lives, the LRU of the disk tier
(every server on the store) and of the host pool skips those blocks; its
bytes count against a budget, a share of each tier's cap, and a pin over it
is refused with the numbers, never dropped later.

Where each part runs and what crosses:

- **The ledger holds pins** (book.py): two tables beside ``blocks`` in the
  store's SQLite ledger (disk/ledger/). So a pin outlives the server that
  made it, and every server sharing the store sees it: the disk tier's
  victim query (disk/ledger/room.py) skips a block any live pin holds.
- **API server process** (http_api.py): ``vllm-uma serve`` answers
  ``/v1/uma/pins`` (POST pins, GET lists, DELETE unpins) in an ASGI
  middleware, behind vLLM's own API-key check. A pin is made by sending
  the prompt through vLLM's own completions or chat endpoint in-process
  (asgi_call.py) with ``max_tokens: 1`` and ``kv_transfer_params:
  {"vllm_uma_pin": true}``: vLLM tokenizes, applies the chat template,
  hashes the blocks and prefills what no tier holds (the warm-up), and the
  blocks are stored down the tiers as any request's are. The requests'
  keys, checks and errors: api_requests.py; the counters: metrics.py.
- **Engine-core process, scheduler side** (connector.py): for such a
  request, ``request_finished`` returns the request's full-block offload
  keys, the namespace and the block size in the response's
  ``kv_transfer_params``. The middleware writes the pin into the ledger
  (one transaction, the budget checked inside it), off the event loop.
  Nothing of the scheduler thread waits on the ledger.
- **Engine-core process, the feed thread** (disk/ledger/feed.py) reads the
  live pinned keys of its namespace every second and hands them to the host
  pool's cache policy (pool_policy.py), which skips them when vLLM's
  prepare_store evicts; the memory release keeps them too. Beside a disk
  tier, the network tier TOUCHes them on the KV server every 2 s so its
  LRU keeps them (network/pin_refresh.py).
- ``vllm-uma kv-store ROOT pins|unpin`` read and change the same tables
  (commands/kv_store_pins.py); ``... export|import`` carry a pin's blocks
  to another store as one checked directory (bundle.py: the format and
  checks; bundle_export.py, bundle_import.py: the writing, an import
  storing each block as the disk tier does). The HTTP API does the same
  on the server's own store, a bundle as one tar: ``GET
  /v1/uma/pins/NAME/bundle`` and ``POST /v1/uma/pins/import``
  (http_bundles.py; bundle_tar.py the tar, http_stream.py the streaming).
- ``serve --warm FILE`` posts a list of pins to the server's own API once
  it answers (warm.py).
"""
