// The pause container for the real node (see main.go), for tests only.
module queue-processor.test/cluster/pause

go 1.24.0
