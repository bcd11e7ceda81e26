"""`vllm-uma fleet`: several vllm-uma servers on one host behind vLLM's router.

There is no vLLM extension point for this: a fleet is processes. The
``vllm-uma fleet`` process is a supervisor; it runs no model itself.

    client --HTTP--> gate --> vllm-router (kv_aware) --HTTP--> server 1 .. server N
                              (127.0.0.1)  ^                         |
                                           +-- ZMQ KV events --------+
                                               (relay.py)            |
                             one shared disk store (L3) <------------+  (disk/ledger/)

- plan.py decides, as a pure function of the flags and the machine: each
  server's port, its cores (``VLLM_CPU_OMP_THREADS_BIND``, disjoint ranges),
  its share of ``--gpu-memory-utilization``, its KV events endpoint, the
  shared disk tier, and the router's command line.
- supervisor.py runs the plan: starts the servers (server_process.Server),
  then ``vllm-router`` with ``--policy kv_aware`` subscribed to every
  server's events; restarts a server that dies (the router's health checks
  take it out meanwhile and retry its requests on the others); on Ctrl-C or
  SIGTERM stops the router, then the servers, whose disk tiers drain.
- relay.py carries each server's KV events to the router on 127.0.0.1
  (the router only connects, and vLLM only listens on every interface).
- gate.py is where clients reach the router (``--host``/``--port``): /v1/*,
  /health and /metrics for clients, the router's worker administration
  for the fleet's hosts only; the router itself listens on 127.0.0.1.
  router_front.py starts and stops the two for the supervisor.
- api_key.py: the fleet's API key, one file on every host; every server
  requires it (server_guard.py, on every path but /health and /metrics),
  the router sends it (router_main.py, its launcher reading the file) and
  the gate puts it on each request it passes. No command line holds it.
- the command, ``vllm-uma fleet``, is commands/fleet.py: it parses the
  flags and reports errors the vLLM way.

What crosses process boundaries: command lines and environment (supervisor
-> servers, router; the key file's path, never the key), HTTP (gate <->
router <-> servers, health checks), ZMQ KV events
(servers -> relay threads in the supervisor -> router, loopback only), and the disk
store's files and ledger (servers <-> servers).
"""
