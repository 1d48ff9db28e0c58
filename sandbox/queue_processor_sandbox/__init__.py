"""The embedded sandbox: AWS (moto's server, with the lifecycle-action behaviour moto lacks) and a Kubernetes
API server (the emulation, or a real control plane), both reached over HTTP on 127.0.0.1 by the same clients
production uses.

A distribution of its own (``sandbox/pyproject.toml``, ``queue-processor-sandbox``), installed beside the
controller for ``make demo``, the tests and the benchmarks; the controller's wheel and image contain none of
it, and the controller imports nothing from it. Modules: :mod:`.clock` (the time scale), :mod:`.aws`,
:mod:`.kube` (the emulation), :mod:`.control_plane` and :mod:`.real_kube` (the real control plane),
:mod:`.environment` (both sides in step, scenarios), :mod:`.run` (a scenario run and its judge),
:mod:`.processes` (controllers as processes), :mod:`.storyline` and :mod:`.explore` (the storyline explorer),
:mod:`.command` (``queue-processor sandbox``).
"""
