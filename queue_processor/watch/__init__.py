"""The API server's objects watched into local copies: pods by node (:mod:`.watched`), nodes
(:mod:`.node_cache`) and pod deletions a drain waits for (:mod:`.departures`)."""
