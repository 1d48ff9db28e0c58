"""The operations docs (``docs/install.md``, ``docs/runbook.md``) against the artefacts they describe.

Every Helm value, Terraform input and output, ``queue-processor`` command and flag, sandbox scenario and log
message the docs name must exist; the runbook must have a section for every alert of the chart and every
CloudWatch alarm of the module, quote each alert's expression as the chart renders it, and name each alarm's
metric and threshold. Each check is a small pure function, also run on a broken sample, so a check that can
no longer fail is noticed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import hcl2
import pytest
import yaml
from hcl2 import SerializationOptions

from queue_processor.cli import main
from queue_processor_sandbox.environment import SCENARIOS as SCENARIO_NAMES
from tests.conftest import ROOT

INSTALL = ROOT / "docs" / "install.md"
RUNBOOK = ROOT / "docs" / "runbook.md"
DOCS = (INSTALL, RUNBOOK)
CHART = ROOT / "charts" / "queue-processor"
MODULE = ROOT / "terraform"
_OPTIONS = SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)
#: Module block arguments that are Terraform's own, not inputs of the module.
_META_ARGUMENTS = {"source", "version", "providers", "depends_on", "count", "for_each"}

_FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)


# ------------------------------------------------------------------------------------------ reading the docs


def _text(path: Path) -> str:
    if not path.exists():
        pytest.fail(f"{path.relative_to(ROOT)} is missing")
    return path.read_text()


def fenced_blocks(text: str, *langs: str) -> list[str]:
    """Bodies of the fenced code blocks of ``text`` whose language is one of ``langs`` (any when none)."""
    return [m["body"] for m in _FENCE.finditer(text) if not langs or m["lang"] in langs]


def prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return _FENCE.sub("", text)


def code_spans(text: str) -> list[str]:
    """Inline code spans of the prose, whitespace collapsed (a span may wrap over two lines)."""
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose(text))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(text: str) -> dict[str, str]:
    """Anchor → the section's text (its heading to the next heading of the same or a higher level), for
    every heading outside code blocks; repeated anchors get GitHub's ``-1``, ``-2`` suffixes."""
    found: list[tuple[str, int, int]] = []  # anchor, level, offset
    seen: dict[str, int] = {}
    body = _FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)  # same offsets, no code headings
    for match in re.finditer(r"^(#{1,6}) (.+)$", body, re.M):
        anchor = slug(match[2])
        if anchor in seen:
            seen[anchor] += 1
            anchor = f"{anchor}-{seen[anchor]}"
        else:
            seen[anchor] = 0
        found.append((anchor, len(match[1]), match.start()))
    result = {}
    for index, (anchor, level, start) in enumerate(found):
        end = next((s for _, lv, s in found[index + 1 :] if lv <= level), len(text))
        result[anchor] = text[start:end]
    return result


def shell_lines(text: str) -> Iterator[str]:
    """Each command of the shell blocks of ``text``, continuation lines (``\\``) joined, comments dropped."""
    for block in fenced_blocks(text, "sh", "bash", "shell"):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                yield line


# ------------------------------------------------------------------------------------- what the docs name


def helm_set_keys(text: str) -> list[str]:
    """Keys given with ``--set key=value`` anywhere in ``text``."""
    return re.findall(r"--set\s+([A-Za-z][\w.\-]*)=", text)


def value_assignments(text: str) -> list[str]:
    """Keys of code spans written ``chartValue=...`` (a lower-case first letter, so environment variables
    such as ``KUBE_API_QPS=50`` are left out)."""
    keys = []
    for span in code_spans(text):
        match = re.fullmatch(r"([a-z][A-Za-z0-9]*(?:\.[A-Za-z0-9]+)*)=[^\"\s]\S*", span)
        if match:
            keys.append(match[1])
    return keys


def values_file_keys(text: str) -> list[str]:
    """Dotted leaf keys of the YAML blocks of ``text`` (values files)."""
    keys: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            keys.append(prefix.rstrip("."))

    for block in fenced_blocks(text, "yaml"):
        walk(yaml.safe_load(block), "")
    return keys


def terraform_outputs_named(text: str) -> list[str]:
    """Outputs read with ``terraform output -raw NAME`` (or ``-json``), and ``module.queue_processor.NAME``."""
    names = re.findall(r"terraform output -(?:raw|json) ([a-z_][a-z0-9_]*)", text)
    return names + re.findall(r"module\.queue_processor\.([a-z_][a-z0-9_]*)", text)


def module_inputs(text: str) -> list[set[str]]:
    """The inputs of each ``module "queue_processor"`` block in the HCL blocks of ``text``."""
    found = []
    for block in fenced_blocks(text, "hcl", "terraform"):
        for entry in hcl2.loads(block, serialization_options=_OPTIONS).get("module", []):
            body = entry.get("queue_processor")
            if body is not None:
                found.append(set(body) - _META_ARGUMENTS)
    return found


def cli_invocations(text: str) -> list[tuple[str, list[str], str]]:
    """``(subcommand, --options, line)`` for every ``queue-processor`` command in the shell blocks and in
    code spans that start with it: at the start of a command, after ``--`` (kubectl exec) or a pipe."""
    candidates = list(shell_lines(text)) + [s for s in code_spans(text) if s.startswith("queue-processor ")]
    found = []
    start = re.compile(r"(?:^|\|\s*|&&\s*|\s--\s+)(?:[\w./-]*/)?queue-processor\s+([a-z][\w-]*)(.*)")
    for line in candidates:
        for match in start.finditer(line):
            rest = re.split(r"\s(?:\||>|<|&&|;)\s?", match[2] + " ", maxsplit=1)[0]
            options = [token.split("=", 1)[0] for token in rest.split() if token.startswith("--")]
            found.append((match[1], options, line))
    return found


def quoted_log_messages(text: str) -> list[str]:
    """Log messages the docs quote: code spans that are one double-quoted string, and jq's
    ``.event == "..."``."""
    messages = [s[1:-1] for s in code_spans(text) if re.fullmatch(r'"[^"]+"', s)]
    for block in fenced_blocks(text):
        messages += [" ".join(m.split()) for m in re.findall(r'\.event == "([^"]+)"', block)]
    return messages


# ------------------------------------------------------------------------------------ what really exists


@functools.cache
def chart_values() -> dict[str, Any]:
    loaded = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def is_value_key(values: dict[str, Any], dotted: str) -> bool:
    """Whether ``dotted`` names a key of ``values``: every part exists, or the path enters a map whose
    default is empty (free-form, such as ``prometheusRule.labels``)."""
    node: Any = values
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return isinstance(node, dict) and not node
    return True


@functools.cache
def module_variables() -> dict[str, dict[str, Any]]:
    with (MODULE / "variables.tf").open() as handle:
        loaded = hcl2.load(handle, serialization_options=_OPTIONS)
    return {name: body for entry in loaded["variable"] for name, body in entry.items()}


@functools.cache
def module_outputs() -> set[str]:
    return set(re.findall(r'^output "(\w+)"', (MODULE / "outputs.tf").read_text(), re.M))


@functools.cache
def alarms() -> dict[str, dict[str, Any]]:
    with (MODULE / "alarms.tf").open() as handle:
        loaded = hcl2.load(handle, serialization_options=_OPTIONS)
    found = {}
    for entry in loaded["resource"]:
        found.update(entry.get("aws_cloudwatch_metric_alarm", {}))
    return found


def alarm_anchors() -> dict[str, str]:
    """Alarm resource name → the runbook anchor its description links to."""
    anchors = {}
    for name, alarm in alarms().items():
        match = re.search(r"\$\{var\.runbook_url\}#([a-z0-9-]+)$", alarm["alarm_description"])
        assert match, f"alarm {name} links no runbook section"
        anchors[name] = match[1]
    return anchors


@functools.cache
def alert_rules() -> dict[str, tuple[str, str]]:
    """Alert name → (runbook anchor, expression with the selector written ``{sel}``), read from the
    PrometheusRule template (its text: the template is not YAML before Helm renders it)."""
    template = (CHART / "templates" / "prometheusrule.yaml").read_text()
    rules = {}
    for chunk in re.split(r"^\s+- alert: ", template, flags=re.M)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        expr = re.search(r"expr: \|\n(.*?)\n\s+(?:for|labels):", chunk, re.S)
        anchor = re.search(r'printf "%s#([a-z0-9-]+)"', chunk)
        assert expr, name
        assert anchor, name
        text = re.sub(r"\{ \{\{- \$sel -\}\} \}", "{sel}", expr[1])
        text = re.sub(r"\{ \{\{- \$sel -\}\} ,", "{sel,", text)
        rules[name] = (anchor[1], text)
    return rules


@functools.cache
def log_messages() -> set[str]:
    """Every message the package logs (structlog's first argument, or the message an operation's end is logged
    with: ``steps.nothing_to_drain``, ``not_ours``, ``requeue``), whitespace collapsed."""
    call = re.compile(
        r"(?:\.(?:debug|info|warning|error|exception|critical)|\b(?:nothing_to_drain|not_ours|requeue))"
        r'\(\s*(?:ctx,\s*)?"((?:[^"\\]|\\.)*)"',
        re.S,
    )
    found = set()
    for path in (ROOT / "queue_processor").rglob("*.py"):
        found.update(" ".join(m.split()) for m in call.findall(path.read_text()))
    return found


def _squash(expression: str) -> str:
    return re.sub(r"\s+", "", expression)


def cli_problems(invocations: list[tuple[str, list[str], str]]) -> list[str]:
    problems = []
    for name, options, line in invocations:
        command = main.get_command(click.Context(main), name)  # the sandbox's command too (an entry point)
        if command is None:
            problems.append(f"no subcommand {name!r}: {line}")
            continue
        known = {"--help", "-h"}
        for param in command.params:
            if isinstance(param, click.Option):
                known.update(param.opts + param.secondary_opts)
        problems += [f"{name} has no option {option}: {line}" for option in options if option not in known]
    return problems


# ------------------------------------------------------------------------------------------------- tests


def test_the_runbook_has_a_section_for_every_alarm_and_alert() -> None:
    anchors = set(sections(_text(RUNBOOK)))
    wanted = set(alarm_anchors().values()) | {anchor for anchor, _ in alert_rules().values()}
    assert len(alarm_anchors()) == 3
    assert len(alert_rules()) == 4
    assert wanted <= anchors, f"docs/runbook.md has no section for {sorted(wanted - anchors)}"


def test_each_alert_section_quotes_the_expression_the_chart_renders() -> None:
    runbook = sections(_text(RUNBOOK))
    for name, (anchor, expression) in alert_rules().items():
        quoted = [_squash(b) for b in fenced_blocks(runbook.get(anchor, ""), "promql")]
        assert _squash(expression) in quoted, f"section {anchor} does not quote the expression of {name}"


def test_each_alarm_section_names_its_metric_threshold_and_periods() -> None:
    runbook = sections(_text(RUNBOOK))
    for name, anchor in alarm_anchors().items():
        alarm, section = alarms()[name], runbook.get(anchor, "")
        assert alarm["metric_name"] in section, (anchor, alarm["metric_name"])
        for key, where in (
            ("threshold", section),
            ("evaluation_periods", section),
            ("period", _text(RUNBOOK)),
        ):
            variable = re.fullmatch(r"\$\{var\.(\w+)\}", str(alarm[key]))
            if variable:
                assert f"`{variable[1]}`" in where, (anchor, key, variable[1])
            else:
                assert re.search(rf"\b{alarm[key]}\b", where), (anchor, key, alarm[key])


def test_every_helm_value_the_docs_set_is_a_chart_value() -> None:
    keys = [key for doc in DOCS for key in helm_set_keys(_text(doc)) + value_assignments(_text(doc))]
    keys += values_file_keys(_text(INSTALL))
    assert {"queueURL", "serviceAccount.roleArn", "image.repository", "image.tag"} <= set(keys)
    unknown = sorted({key for key in keys if not is_value_key(chart_values(), key)})
    assert not unknown, f"not keys of charts/queue-processor/values.yaml: {unknown}"


def test_every_terraform_output_the_docs_read_exists() -> None:
    names = [name for doc in DOCS for name in terraform_outputs_named(_text(doc))]
    assert {"queue_url", "role_arn", "dlq_url", "dlq_arn", "queue_arn"} <= set(names)
    unknown = sorted(set(names) - module_outputs())
    assert not unknown, f"not outputs of terraform/outputs.tf: {unknown}"


def test_the_module_block_uses_real_inputs_and_every_required_one() -> None:
    blocks = module_inputs(_text(INSTALL))
    assert blocks, "docs/install.md shows no module block"
    variables = module_variables()
    required = {name for name, body in variables.items() if "default" not in body}
    for inputs in blocks:
        assert not inputs - set(variables), f"not variables of the module: {sorted(inputs - set(variables))}"
        assert required <= inputs, f"required inputs missing: {sorted(required - inputs)}"


def test_every_queue_processor_command_and_flag_exists() -> None:
    invocations = [call for doc in DOCS for call in cli_invocations(_text(doc))]
    assert {"config", "inspect", "sandbox"} <= {name for name, _, _ in invocations}
    problems = cli_problems(invocations)
    assert not problems, "\n".join(problems)


def test_every_sandbox_scenario_the_docs_name_exists() -> None:
    named = [s for doc in DOCS for s in re.findall(r"--scenario[ =]([\w-]+)", _text(doc))]
    assert "spot-storm" in named
    assert not set(named) - set(SCENARIO_NAMES), sorted(set(named) - set(SCENARIO_NAMES))


def test_every_log_message_the_docs_quote_is_logged_by_the_code() -> None:
    quoted = [m for doc in DOCS for m in quoted_log_messages(_text(doc))]
    assert "drain incomplete: requeued" in quoted
    unknown = sorted(set(quoted) - log_messages())
    assert not unknown, f"no log line says {unknown}"


# --- the checks fail when they should -------------------------------------------------------------------------


def test_the_checks_catch_broken_docs() -> None:
    broken = """# Runbook

```sh
helm upgrade x . --set queueUrl=https://example --set prometheusRule.labels.team=a \\
  --set image.digest=sha256
terraform output -raw queue_urls
queue-processor sandbox --scenario spot-strom --nodez 3
kubectl exec deploy/x -- queue-processor inspekt -
qplogs | jq 'select(.event == "drained ok")'
```

Set `dryrun=true`, look for `"cordoned node"`.

## Oldest Message Age

```hcl
module "queue_processor" {
  source       = "./terraform"
  cluster_name = "prod"
  asg_name     = ["a"]
}
```
"""
    unknown = [
        k for k in helm_set_keys(broken) + value_assignments(broken) if not is_value_key(chart_values(), k)
    ]
    assert unknown == ["queueUrl", "image.digest", "dryrun"]
    assert set(terraform_outputs_named(broken)) - module_outputs() == {"queue_urls"}
    problems = cli_problems(cli_invocations(broken))
    assert any("--nodez" in p for p in problems)
    assert any("'inspekt'" in p for p in problems)
    assert set(re.findall(r"--scenario[ =]([\w-]+)", broken)) - set(SCENARIO_NAMES) == {"spot-strom"}
    assert set(quoted_log_messages(broken)) - log_messages() == {"drained ok", "cordoned node"}
    (inputs,) = module_inputs(broken)
    assert inputs - set(module_variables()) == {"asg_name"}
    assert "oldest-message-age" in sections(broken)
    assert "dead-letter-queue-not-empty" not in sections(broken)


def link_problems(doc: Path) -> list[str]:
    """Relative links of ``doc`` whose file is missing, or whose ``#anchor`` is not a heading of a Markdown
    target (links into code files and to other sites are not checked)."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(doc.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            problems.append(f"{doc.name}: {target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in sections(file.read_text()):
            problems.append(f"{doc.name}: {target}: no such section")
    return problems


def test_the_docs_links_lead_somewhere() -> None:
    problems = [problem for doc in DOCS for problem in link_problems(doc)]
    assert not problems, "\n".join(problems)


def test_the_link_check_catches_a_dead_anchor(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("# Doc\n\nSee [it](#doc), [there](#nowhere) and [that](missing.md).\n")
    assert link_problems(doc) == ["doc.md: #nowhere: no such section", "doc.md: missing.md: no such file"]
