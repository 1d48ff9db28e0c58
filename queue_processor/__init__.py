"""queue-processor: drains Kubernetes nodes gracefully when their EC2 instances go away.

It consumes an SQS queue of EC2 / Auto Scaling interruption messages (the queue-processor mode of
aws-node-termination-handler, rebuilt). Entry point: ``queue-processor`` (:mod:`queue_processor.cli`).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("queue-processor")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
