"""Webhook bodies: queue-processor's renderer against NTH's own ``pkg/webhook`` code.

``webhookrender`` (tools/cluster/nth/webhookrender, built by ``make cluster-bin``) posts with NTH v1.25.6's
``webhook.Post`` to a local server and prints the body. The same template over the same data must give the
same bytes here: NTH's default template, the Slack and Teams examples in docs/migration.md, and generated
templates. What each interruption puts in the data (NTH's EventID, Kind, Description, StartTime) is checked
against NTH's formats, read from its source (tests/migration/nth.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queue_processor.aws import InstanceInfo
from queue_processor.events import Event
from queue_processor.observe.templates import DEFAULT_WEBHOOK_TEMPLATE, check_template, nth_data
from queue_processor.observe.webhook import drain_data
from queue_processor.parse import parse as parse_body
from queue_processor_gotemplate import GoTime, NilMap, NilSlice, Struct, TemplateError, parse
from tests.conftest import REQUIRE_REAL_CLUSTER, ROOT
from tests.migration import nth

GUIDE = (ROOT / "docs" / "migration.md").read_text()
#: The guide's example templates (its ```gotemplate blocks).
EXAMPLES = re.findall(r"```gotemplate\n(.*?)\n```", GUIDE, re.S)


class Renderer:
    """One ``webhookrender`` process: :meth:`render` sends a template and NTH's event fields, returns
    ``{"valid": error or "", "sent": bool, "body": str}``."""

    def __init__(self, path: Path) -> None:
        self.process = subprocess.Popen(
            [str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8"
        )

    def render(self, template: str, event: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps({"template": template, "event": event}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "webhookrender exited"
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()


@pytest.fixture(scope="module")
def nth_webhook() -> Iterator[Renderer]:
    """NTH's renderer, built by ``make cluster-bin``: skipped when missing, failed with
    QP_REQUIRE_REAL_CLUSTER=1 (CI)."""
    from queue_processor_sandbox.control_plane import default_bin_dir

    env = os.environ.get("QP_CLUSTER_BIN")
    path = (Path(env) if env else default_bin_dir()) / "webhookrender"
    if not os.access(path, os.X_OK):
        message = f"{path} is missing: run `make cluster-bin`"
        if REQUIRE_REAL_CLUSTER:
            pytest.fail(f"QP_REQUIRE_REAL_CLUSTER=1 and {message}")
        pytest.skip(message)
    renderer = Renderer(path)
    yield renderer
    renderer.close()


def go_fields(data: Struct) -> dict[str, Any]:
    """``data`` as NTH's monitor.InterruptionEvent JSON (the harness's input)."""

    def value(v: Any) -> Any:
        if isinstance(v, GoTime):
            return v.format("2006-01-02T15:04:05.999999999Z07:00")
        if isinstance(v, NilSlice | NilMap):
            return None
        return v

    keys = {key for key, _ in nth.WEBHOOK_EVENT_FIELDS}
    return {key: value(data[key]) for key in keys}


def python_render(template: str, data: Struct) -> dict[str, Any]:
    """What queue-processor does with ``template``, in the harness's terms."""
    try:
        check_template(template)
    except TemplateError as exc:
        return {"valid": str(exc), "sent": False, "body": ""}
    try:
        return {"valid": "", "sent": True, "body": parse(template).execute(data)}
    except TemplateError:
        return {"valid": "", "sent": False, "body": ""}


def same(template: str, data: Struct, renderer: Renderer) -> None:
    ours = python_render(template, data)
    theirs = renderer.render(template, go_fields(data))
    assert bool(ours["valid"]) == bool(theirs["valid"]), (ours, theirs)  # a start-up failure in both
    if not ours["valid"]:
        assert ours["sent"] == theirs["sent"], (ours, theirs)
        assert ours["body"] == theirs["body"]


SAMPLES = ROOT.parent / "shared" / "samples" / "messages"
INFO = InstanceInfo(
    instance_id="i-0123456789abcdef0",
    private_dns_name="ip-10-0-1-23.us-west-2.compute.internal",
    availability_zone="us-west-2a",
    state="running",
    tags={"aws:autoscaling:groupName": "workers"},
    instance_type="m5.large",
)


def sample_events() -> list[tuple[str, Event]]:
    events: list[tuple[str, Event]] = []
    for path in sorted(SAMPLES.glob("*.json")):
        result = parse_body(path.read_text())
        events.extend((path.stem, event) for event in result.events)
    return events


EVENTS = sample_events()


@pytest.mark.parametrize("template", [DEFAULT_WEBHOOK_TEMPLATE, *EXAMPLES, *nth.WEBHOOK_TEMPLATES])
@pytest.mark.parametrize(("sample", "event"), EVENTS, ids=[name for name, _ in EVENTS])
def test_documented_templates_render_as_nth_renders_them(
    template: str, sample: str, event: Event, nth_webhook: Renderer
) -> None:
    labels = {"node.kubernetes.io/instance-type": "m5.large", "team": 'a"b<c>&d'}
    for pods in (["coredns-1", "web-2"], None):
        data = drain_data(event, node_labels=labels if pods else None, pods=pods, info=INFO)
        # Go's monotonic reading (an AWS Health event's StartTime) does not cross JSON: compared without it
        data["StartTime"] = dataclasses.replace(data["StartTime"], monotonic=None)
        same(template, data, nth_webhook)


def test_the_guide_has_a_slack_and_a_teams_example() -> None:
    assert len(EXAMPLES) == 2
    for example in EXAMPLES:
        body = check_template(example).execute(drain_data(EVENTS[0][1], node_labels={}, pods=[], info=INFO))
        json.loads(body)  # both are JSON whatever the values hold


@pytest.mark.parametrize(("sample", "event"), EVENTS, ids=[name for name, _ in EVENTS])
def test_the_data_holds_nths_values_for_each_kind(sample: str, event: Event) -> None:
    data = drain_data(event, node_labels={"a": "b"}, pods=["p"], info=INFO)
    kind, prefix, sentence = nth.WEBHOOK_KINDS[event.kind]
    assert data["Kind"] == kind
    ident = event.source_id if not hasattr(event, "eventbridge_id") else event.eventbridge_id  # type: ignore[union-attr]
    assert data["EventID"] == prefix + (ident or "").encode().hex()
    assert re.fullmatch(sentence, data["Description"]), data["Description"]
    assert data["Description"].endswith(" \n")
    assert data["Monitor"] == "SQS_MONITOR"
    assert data["IsManaged"]
    assert data["InProgress"]
    assert data["NodeName"] == INFO.private_dns_name
    assert data["ProviderID"] == "aws:///us-west-2a/i-0123456789abcdef0"
    assert data["InstanceType"] == "m5.large"
    assert str(data["EndTime"]) == "0001-01-01 00:00:00 +0000 UTC"
    start = str(data["StartTime"])
    if kind == "SCHEDULED_EVENT":  # NTH: time.Now(), printed with Go's monotonic reading
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? [-+]\d{4} \S+ m=\+\d+\.\d{9}", start)
    else:
        assert start == str(GoTime(event.time))


def test_go_time_prints_as_go() -> None:
    utc = GoTime(datetime(2020, 7, 1, 22, 19, 58, tzinfo=UTC))
    assert str(utc) == "2020-07-01 22:19:58 +0000 UTC"
    plus_one = GoTime(datetime(2020, 7, 1, 22, 19, 58, 120000, tzinfo=timezone(timedelta(hours=1))))
    assert str(plus_one) == "2020-07-01 22:19:58.12 +0100 +0100"
    assert str(GoTime(utc.moment, monotonic=12.5)) == "2020-07-01 22:19:58 +0000 UTC m=+12.500000000"


@pytest.mark.parametrize(
    ("template", "what"),
    [
        ('{{ define "x" }}{{ end }}', "define"),
        ('{{ template "x" }}', "template"),
        ("{{ .Kind | sha256sum }}", "sha256sum"),
        ("{{ 1.5 }}", "1.5"),
        ("{{ 'a' }}", "character"),
        ("{{ .cat }}", "can't evaluate field cat"),
        ("{{ .Kind ", "unclosed action"),
        ("{{ if .Kind }}", "EOF"),
    ],
)
def test_templates_outside_the_subset_or_broken_are_refused_naming_what(template: str, what: str) -> None:
    with pytest.raises(TemplateError, match=re.escape(what)):
        check_template(template)


# ------------------------------------------------------------------------------ generated templates

TEXT = st.text(st.sampled_from(list("ab {}\"'\\<>&\n\t-.é😀")), max_size=6).filter(lambda t: "{{" not in t)
STRINGS = st.text(st.sampled_from(list('aZ0 _-.:/"\\<>&\n\té😀')), max_size=8)
STRING_FIELDS = [".EventID", ".Kind", ".InstanceID", ".NodeName", ".Description", ".State", ".ProviderID"]
LAYOUT_CHUNKS = [
    "2006", "06", "01", "1", "Jan", "January", "02", "2", "_2", "002", "__2", "15", "03", "3", "04", "4", "05",
    "5", "PM", "pm", "Mon", "Monday", "MST", "-0700", "-07:00", "-07", "Z07:00", "Z0700", "Z07", ".000", ".999",
    ",000", ".9", " ", "T", ":", "-", "/", "x", "Janx", "Monx",
]  # fmt: skip


def go_string(text: str) -> str:
    """``text`` as a Go interpreted string literal (JSON's escapes of these characters are Go's too)."""
    return json.dumps(text, ensure_ascii=False)


@st.composite
def string_expr(draw: st.DrawFn) -> str:
    """A pipeline that yields a string."""
    base = draw(st.one_of(st.sampled_from(STRING_FIELDS), STRINGS.map(go_string)))
    choice = draw(st.integers(0, 14))
    literal = go_string(draw(STRINGS))
    return [
        base,
        f"{base} | upper",
        f"{base} | lower",
        f"{base} | title",
        f"{base} | trim",
        f"trimPrefix {literal} {base}",
        f"trimSuffix {literal} {base}",
        f"replace {literal} {go_string(draw(STRINGS))} {base}",
        f"{base} | default {literal}",
        f'printf "%s|%q|%v" {base} {base} {base}',
        f"{base} | quote",
        f"{base} | nospace",
        f"{base} | b64enc",
        f"{base} | toJson",
        f'splitList {literal} {base} | sortAlpha | join ","',
    ][choice]


@st.composite
def action(draw: st.DrawFn, depth: int = 0) -> str:
    """One action (or control structure) over NTH's data."""
    layout = "".join(draw(st.lists(st.sampled_from(LAYOUT_CHUNKS), max_size=5)))
    simple = [
        f"{{{{ {draw(string_expr())} }}}}",
        "{{ .Pods }}",
        "{{ .NodeLabels }}",
        "{{ .StartTime }}",
        "{{ .EndTime }}",
        f"{{{{ .StartTime.Format {go_string(layout)} }}}}",
        f"{{{{ .StartTime.UTC.Format {go_string(layout)} }}}}",
        "{{ .StartTime.Unix }}",
        "{{ .StartTime.IsZero }}",
        "{{ .IsManaged }}",
        "{{ len .Pods }}",
        '{{ join ", " .Pods }}',
        "{{ .Pods | toJson }}",
        "{{ .NodeLabels | toPrettyJson }}",
        "{{ toJson . }}",
        '{{ index .NodeLabels "team" }}',
        "{{ .NodeLabels.team }}",
        "{{ .NodeLabels.missing }}",
        "{{ first .Pods }}{{ last .Pods }}",
        '{{ has "web-2" .Pods }}',
        f'{{{{ ternary "y" "n" (eq .Kind {go_string(draw(st.sampled_from(["SPOT_ITN", "x"])))}) }}}}',
        "{{ coalesce .State .Kind }}",
        "{{ empty .State }}{{ not .IsManaged }}",
        f"{{{{ and .IsManaged {draw(string_expr())} }}}}",
        f"{{{{ or .State {draw(string_expr())} }}}}",
        f"{{{{ print {draw(string_expr())} 1 2 true }}}}",
        f"{{{{ println {draw(string_expr())} 3 }}}}",
        f"{{{{ repeat 2 ({draw(string_expr())}) }}}}",
        f"{{{{ indent 2 ({draw(string_expr())}) }}}}{{{{ nindent 1 .Description }}}}",
        f'{{{{ contains "a" ({draw(string_expr())}) }}}}{{{{ hasPrefix "i-" .InstanceID }}}}',
        f"{{{{ list .Kind ({draw(string_expr())}) 3 | toJson }}}}",
        f"{{{{ $x := {draw(string_expr())} }}}}{{{{ $x }}}}",
        f"{{{{ date {go_string(layout)} .StartTime }}}}",
        "{{/* a comment */}}",
        "{{- .Kind -}}",
        '{{ printf "%d-%t-%s" 3 true }}',
        '{{ lt 1 2 }}{{ ge "b" "a" }}{{ ne .Kind "x" }}',
    ]
    if depth >= 2:
        return draw(st.sampled_from(simple))
    body = "".join(draw(st.lists(st.one_of(TEXT, action(depth + 1)), max_size=3)))
    other = "".join(draw(st.lists(st.one_of(TEXT, action(depth + 1)), max_size=2)))
    compound = [
        f"{{{{ if {draw(string_expr())} }}}}{body}{{{{ else }}}}{other}{{{{ end }}}}",
        f'{{{{ if eq .Kind "SPOT_ITN" }}}}{body}{{{{ else if .IsManaged }}}}{other}{{{{ end }}}}',
        f"{{{{ with .NodeLabels }}}}{body}{{{{ else }}}}{other}{{{{ end }}}}",
        f"{{{{ range $i, $p := .Pods }}}}{{{{ $i }}}}={{{{ $p }}}}{body}{{{{ else }}}}{other}{{{{ end }}}}",
        f"{{{{ range $k, $v := .NodeLabels }}}}{{{{ $k }}}}:{{{{ $v | quote }}}}{body}{{{{ end }}}}",
        f'{{{{ range .Pods }}}}{{{{ . }}}}{{{{ if eq . "web-2" }}}}{{{{ break }}}}{{{{ end }}}}{body}{{{{ end }}}}',
        f"{{{{- with $d := .Description }}}}{{{{ $d | trim }}}}{body}{{{{ end -}}}}",
    ]
    return draw(st.sampled_from(simple + compound))


@st.composite
def templates(draw: st.DrawFn) -> str:
    return "".join(draw(st.lists(st.one_of(TEXT, action()), min_size=1, max_size=4)))


@st.composite
def datas(draw: st.DrawFn) -> Struct:
    offset = draw(st.sampled_from([None, 0, 3600, -5 * 3600 - 1800]))
    zone = UTC if offset is None else timezone(timedelta(seconds=offset))
    moment = datetime(2020, 7, 1, 22, 19, 58, tzinfo=UTC) + timedelta(
        seconds=draw(st.integers(-(10**8), 10**8)), microseconds=draw(st.sampled_from([0, 120000, 123456]))
    )
    pods = draw(
        st.one_of(st.none(), st.lists(st.sampled_from(["coredns-1", "web-2", 'we"b', "<p>"]), max_size=3))
    )
    labels = draw(
        st.one_of(st.none(), st.dictionaries(st.sampled_from(["team", "zone", "a"]), STRINGS, max_size=3))
    )
    return nth_data(
        {
            "EventID": "spot-itn-event-" + draw(STRINGS).encode().hex(),
            "Kind": draw(st.sampled_from(["SPOT_ITN", "ASG_LIFECYCLE", "STATE_CHANGE"])),
            "Monitor": "SQS_MONITOR",
            "Description": draw(STRINGS) + " \n",
            "NodeName": draw(STRINGS),
            "InstanceID": "i-" + draw(STRINGS),
            "ProviderID": draw(STRINGS),
            "NodeLabels": NilMap() if labels is None else labels,
            "Pods": pods if pods else NilSlice(),
            "IsManaged": draw(st.booleans()),
            "InProgress": True,
            "StartTime": GoTime(moment.astimezone(zone)),
        }
    )


@given(template=templates(), data=datas())
def test_generated_templates_render_as_nth_renders_them(
    template: str, data: Struct, nth_webhook: Renderer
) -> None:
    same(template, data, nth_webhook)
