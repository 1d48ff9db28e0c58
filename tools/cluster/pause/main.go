// The pause container of the real node's pods (sandbox/queue_processor_sandbox/real_node.py): it holds the
// pod's namespaces and does nothing until SIGTERM or SIGINT, as Kubernetes' own pause does. Built here because
// no registry image (registry.k8s.io/pause) can be pulled on the machines this project is built on.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
