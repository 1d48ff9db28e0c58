"""queue-processor: drains Kubernetes nodes gracefully when their EC2 instances go away, from an SQS queue of
interruption messages (aws-node-termination-handler's queue-processor mode, rebuilt); see :mod:`.cli`."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("queue-processor")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
