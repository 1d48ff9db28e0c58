"""Node drain: pure kubectl-drain pod filters (``filters``) and the drainer that cordons, evicts and waits."""
