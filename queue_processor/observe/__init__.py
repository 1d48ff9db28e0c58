"""Observability: what the pipeline reports and the Prometheus metrics (:mod:`.metrics`), structured logs
(:mod:`.logs`), Kubernetes Events (:mod:`.events`) and the webhook (:mod:`.webhook`); :mod:`queue_processor.app`
serves ``/metrics``, ``/healthz`` and ``/readyz``. This package imports nothing itself."""
