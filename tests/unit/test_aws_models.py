"""The trimmed botocore data (queue_processor.aws.trim_service_model, trim_endpoints): what a client of the
controller keeps of a service model and of the endpoints data, on botocore's own files."""

from __future__ import annotations

from botocore.loaders import Loader

from queue_processor.aws import TrimmedModels, trim_endpoints, trim_service_model


def test_a_trimmed_model_keeps_the_operations_and_every_shape_they_reach() -> None:
    full = Loader().load_service_model("ec2", "service-2")
    trimmed = trim_service_model(full, ["DescribeTags", "NoSuchOperation"])
    assert list(trimmed["operations"]) == ["DescribeTags"]
    assert trimmed["metadata"] == full["metadata"]
    # The closure: DescribeTagsRequest's Filters → FilterList → Filter → ValueStringList → String…
    for name in ("DescribeTagsRequest", "DescribeTagsResult", "FilterList", "Filter", "TagDescriptionList"):
        assert name in trimmed["shapes"], name
    for shape in trimmed["shapes"].values():
        refs = [m["shape"] for m in (shape.get("members") or {}).values()]
        refs += [shape[part]["shape"] for part in ("member", "key", "value") if part in shape]
        assert set(refs) <= set(trimmed["shapes"])
    assert "RunInstancesRequest" not in trimmed["shapes"]
    assert "documentation" not in str(trimmed["operations"]) + str(trimmed["shapes"])
    assert len(trimmed["shapes"]) < len(full["shapes"]) // 50


def test_the_endpoints_keep_every_partition_with_only_the_services_asked_for() -> None:
    full = Loader().load_data("endpoints")
    trimmed = trim_endpoints(full, ["sqs", "ec2", "autoscaling"])
    assert [p["partition"] for p in trimmed["partitions"]] == [p["partition"] for p in full["partitions"]]
    aws = next(p for p in trimmed["partitions"] if p["partition"] == "aws")
    assert set(aws["services"]) == {"sqs", "ec2", "autoscaling"}
    assert aws["regions"] == next(p for p in full["partitions"] if p["partition"] == "aws")["regions"]


def test_the_loader_trims_only_the_services_it_is_given() -> None:
    loader = Loader(file_loader=TrimmedModels({"ec2": ("DescribeInstances",)}))
    assert list(loader.load_service_model("ec2", "service-2")["operations"]) == ["DescribeInstances"]
    assert len(loader.load_service_model("sqs", "service-2")["operations"]) > 10  # not asked for: whole
    assert loader.load_service_model("ec2", "paginators-1")["pagination"]  # other files whole
