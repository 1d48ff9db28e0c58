"""Node drain: the pure plan (kubectl-drain filters, waves, grace), one pod's eviction, the node writes, and the
drainer that lists, evicts and waits."""
