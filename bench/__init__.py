"""``postbox-bench``: throughput, latency and memory of postbox (and its peers) on this machine."""
