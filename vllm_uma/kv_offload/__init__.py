"""KV offloading on the unified-memory platform (L1 -> L2 host pool)."""
