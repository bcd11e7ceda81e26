"""Code that tests and tools share and the runtime does not.

server.py reads a running server from outside (its model process, /metrics,
/proc); reference.py is the transformers reference a served answer is
compared with.
"""
