"""The embedded sandbox: AWS (moto's server, with the lifecycle-action behaviour moto lacks) and a Kubernetes
API server, both reached over HTTP on 127.0.0.1 by the same clients production uses.

Modules: :mod:`.clock` (the time scale), :mod:`.aws`, :mod:`.kube`. Nothing here is imported by the
controller itself; it needs the ``sandbox`` extra (moto).
"""
