"""Build the local control plane's binaries from Go modules and cache them by version.

No release binary can be downloaded on the machines this project runs on, and there is no
Docker: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok and
kwokctl are compiled from the Go module proxy with the machine's Go. Each component has a
builder module under `gobuild/<component>/` whose go.mod and go.sum pin every dependency;
the version in its go.mod is the single source of truth for what gets built.

Binaries land in `~/.cache/specdecode/<component>-<version>/bin` (or under
`$SPECDECODE_CACHE_DIR`, else `$XDG_CACHE_HOME/specdecode`). Go's own module and build
caches stay in their default places, so a rebuild after a pin change is incremental.

The planning half (versions, cache paths, linker flags, the digest of the build inputs) is
pure; `ensure_binaries` is the shell that runs `go` when the cache misses.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from specdecode.tools.localstack.progress import BuildReporter, make_reporter

GOBUILD_ROOT = Path(__file__).resolve().parent / "gobuild"

# The Go release that every builder module accepts (etcd 3.6 declares `go 1.26.0`). Checked
# up front so that an old Go fails with a fix instead of a toolchain-download attempt.
MINIMUM_GO = (1, 26)


class BuildError(RuntimeError):
    """A component could not be built; the message names the command and the fix."""


@dataclass(frozen=True)
class ComponentSpec:
    """What one builder module produces.

    `module` is the dependency whose version keys the cache directory; `packages` are the
    main packages built in one `go build` call (so their shared dependencies compile once),
    each producing a binary named after the last element of its import path.
    """

    name: str
    module: str
    packages: tuple[str, ...]
    binaries: tuple[str, ...]


KUBERNETES = ComponentSpec(
    name="kubernetes",
    module="k8s.io/kubernetes",
    packages=(
        "k8s.io/kubernetes/cmd/kube-apiserver",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        "k8s.io/kubernetes/cmd/kube-scheduler",
        "k8s.io/kubernetes/cmd/kubectl",
    ),
    binaries=("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
)
ETCD = ComponentSpec(
    name="etcd",
    module="go.etcd.io/etcd/server/v3",
    # The builder module's own main package (module path ends in /etcd, so the binary is `etcd`).
    packages=(".",),
    binaries=("etcd",),
)
KWOK = ComponentSpec(
    name="kwok",
    module="sigs.k8s.io/kwok",
    packages=("sigs.k8s.io/kwok/cmd/kwok", "sigs.k8s.io/kwok/cmd/kwokctl"),
    binaries=("kwok", "kwokctl"),
)
HELM = ComponentSpec(
    name="helm",
    module="helm.sh/helm/v3",
    packages=("helm.sh/helm/v3/cmd/helm",),
    binaries=("helm",),
)
COMPONENTS: tuple[ComponentSpec, ...] = (ETCD, KWOK, KUBERNETES, HELM)


@dataclass(frozen=True)
class ComponentBuild:
    """A planned build: where its inputs are, where its binaries go, and what keys them."""

    spec: ComponentSpec
    version: str
    builder_dir: Path
    cache_dir: Path
    ldflags: tuple[str, ...]
    digest: str

    @property
    def bin_dir(self) -> Path:
        return self.cache_dir / "bin"

    @property
    def info_file(self) -> Path:
        return self.cache_dir / "build-info.json"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every binary the local stack runs, and the versions they report."""

    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    etcd: Path
    kwok: Path
    kwokctl: Path
    helm: Path
    kubernetes_version: str
    etcd_version: str
    kwok_version: str
    helm_version: str

    def as_dict(self) -> dict[str, str]:
        return {key: str(value) for key, value in self.__dict__.items()}


# --------------------------------------------------------------------------------------------
# Pure planning
# --------------------------------------------------------------------------------------------

_REQUIRE_LINE = re.compile(r"^\s*(?:require\s+)?(?P<module>\S+)\s+(?P<version>v\S+)(?:\s*//.*)?$")
_GO_DIRECTIVE = re.compile(r"^go\s+(?P<major>\d+)\.(?P<minor>\d+)(?:\.\d+)?\s*$", re.MULTILINE)


def required_version(gomod_text: str, module: str) -> str:
    """The version of `module` that a go.mod requires (a `replace` line never matches)."""
    for line in gomod_text.splitlines():
        if "=>" in line:
            continue
        match = _REQUIRE_LINE.match(line)
        if match and match.group("module") == module:
            return match.group("version")
    raise BuildError(f"go.mod does not require {module}: the builder module is damaged")


def go_directive(gomod_text: str) -> tuple[int, int]:
    """The (major, minor) of a go.mod's `go` line."""
    match = _GO_DIRECTIVE.search(gomod_text)
    if not match:
        raise BuildError("go.mod has no `go` directive: the builder module is damaged")
    return int(match.group("major")), int(match.group("minor"))


def parse_go_version(output: str) -> tuple[int, int, int]:
    """(1, 26, 8) from `go version` output such as 'go version go1.26.8 linux/amd64'."""
    match = re.search(r"\bgo(\d+)\.(\d+)(?:\.(\d+))?", output)
    if not match:
        raise BuildError(f"cannot read the Go version from {output.strip()!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def kubernetes_version_ldflags(version: str, build_date: str) -> tuple[str, ...]:
    """Linker flags that make the binaries report `version` the way release builds do.

    Kubernetes stamps its version into two packages (hack/lib/version.sh): component-base's,
    which `--version`, `kubectl version` and the apiserver's /version read, and client-go's,
    which goes into every client's User-Agent. The module proxy serves no commit id, so
    gitCommit stays empty rather than invented.
    """
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", version)
    if not match:
        raise BuildError(f"unexpected Kubernetes version {version!r}: expected vMAJOR.MINOR.PATCH")
    values = {
        "gitMajor": match.group(1),
        "gitMinor": match.group(2),
        "gitVersion": version,
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": build_date,
    }
    return tuple(
        f"-X {package}.{name}={value}"
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for name, value in values.items()
    )


def helm_version_ldflags(version: str, client_go_version: str) -> tuple[str, ...]:
    """Linker flags that stamp Helm's version and the Kubernetes minor it was built against.

    Helm's Makefile stamps both: without them `helm version` says "v3.19" and `helm template`
    / `helm lint` assume Kubernetes 1.20 for `.Capabilities.KubeVersion`. The Kubernetes
    minor comes from the client-go that the pinned Helm requires (v0.34.x -> 1.34).
    """
    match = re.fullmatch(r"v0\.(\d+)\.\d+", client_go_version)
    if not match:
        raise BuildError(f"unexpected client-go version {client_go_version!r}: expected v0.MINOR.PATCH")
    k8s = {"k8sVersionMajor": "1", "k8sVersionMinor": match.group(1)}
    return (
        f"-X helm.sh/helm/v3/internal/version.version={version}",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
        *(f"-X helm.sh/helm/v3/pkg/{package}.{name}={value}"
          for package in ("lint/rules", "chartutil") for name, value in k8s.items()),
    )


def ldflags_for(spec: ComponentSpec, version: str, build_date: str, gomod_text: str = "") -> tuple[str, ...]:
    """Strip symbols and DWARF (`-s -w`: a third of the size, faster links) plus version stamps."""
    flags: tuple[str, ...] = ("-s", "-w")
    if spec is KUBERNETES:
        flags += kubernetes_version_ldflags(version, build_date)
    if spec is HELM:
        flags += helm_version_ldflags(version, required_version(gomod_text, "k8s.io/client-go"))
    return flags


# A fixed date stands in for the real one when hashing the inputs: the build date is stamped
# into the binaries but must not make every build look new.
_DIGEST_BUILD_DATE = "1970-01-01T00:00:00Z"


def build_digest(spec: ComponentSpec, version: str, sources: Mapping[str, bytes], goos_goarch: str) -> str:
    """A digest of everything that decides the binaries' content, except the Go patch release.

    `sources` maps builder-module file names (go.mod, go.sum, *.go) to their bytes. A change
    of pins or flags invalidates the cache; a Go patch update alone does not, since rebuilding
    Kubernetes for it would cost many minutes and change nothing the stack relies on.
    """
    digest = hashlib.sha256()
    digest.update(json.dumps({
        "component": spec.name,
        "version": version,
        "packages": spec.packages,
        "binaries": spec.binaries,
        "ldflags": ldflags_for(spec, version, _DIGEST_BUILD_DATE, sources.get("go.mod", b"").decode()),
        "target": goos_goarch,
        "cgo": False,
    }, sort_keys=True).encode())
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + hashlib.sha256(sources[name]).digest())
    return digest.hexdigest()


def plan_component(
    spec: ComponentSpec,
    builder_dir: Path,
    sources: Mapping[str, bytes],
    cache_root: Path,
    goos_goarch: str,
    build_date: str,
) -> ComponentBuild:
    """Plan one component's build from its builder module's files (pure)."""
    if "go.mod" not in sources or "go.sum" not in sources:
        raise BuildError(f"{builder_dir} lacks go.mod or go.sum: the package is installed incompletely")
    gomod_text = sources["go.mod"].decode()
    version = required_version(gomod_text, spec.module)
    return ComponentBuild(
        spec=spec,
        version=version,
        builder_dir=builder_dir,
        cache_dir=cache_root / f"{spec.name}-{version}",
        ldflags=ldflags_for(spec, version, build_date, gomod_text),
        digest=build_digest(spec, version, sources, goos_goarch),
    )


def default_cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """`$SPECDECODE_CACHE_DIR`, else `$XDG_CACHE_HOME/specdecode`, else `~/.cache/specdecode`."""
    environ = os.environ if environ is None else environ
    if environ.get("SPECDECODE_CACHE_DIR"):
        return Path(environ["SPECDECODE_CACHE_DIR"]).expanduser()
    xdg = environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "specdecode"


def go_build_command(go: str, build: ComponentBuild, out_dir: Path) -> list[str]:
    """The `go build` invocation for one component (run in its builder module)."""
    return [
        go, "build",
        "-v",  # one line per compiled package: the progress display counts them
        "-trimpath",  # no local paths in the binaries; identical output on every machine
        "-buildvcs=false",  # the builder modules sit inside the project's git checkout
        "-mod=readonly",  # never rewrite the pinned go.mod / go.sum in the package
        "-ldflags", " ".join(build.ldflags),
        "-o", str(out_dir) + os.sep,
        *build.spec.packages,
    ]


def go_list_deps_command(go: str, build: ComponentBuild) -> list[str]:
    """Lists every package the build compiles; its length is the progress bar's total."""
    return [go, "list", "-mod=readonly", "-buildvcs=false", "-deps", "-f", "{{.ImportPath}}", *build.spec.packages]


def go_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for `go`: the machine's Go only, static binaries."""
    env = dict(environ)
    # A go.mod asking for a newer Go must fail loudly here rather than hang on a toolchain
    # download that the machines cannot make.
    env["GOTOOLCHAIN"] = "local"
    # Static binaries: no C toolchain needed, and they run on any Linux of the same arch.
    env["CGO_ENABLED"] = "0"
    return env


# --------------------------------------------------------------------------------------------
# The shell: find Go, plan, build on a cache miss
# --------------------------------------------------------------------------------------------

# Where the official Go tarball installs; CI's PATH may not include it.
_WELL_KNOWN_GO = Path("/usr/local/go/bin/go")


def find_go(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    explicit = environ.get("SPECDECODE_GO")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise BuildError(f"SPECDECODE_GO={explicit} is not an executable Go binary")
        return explicit
    found = shutil.which("go", path=environ.get("PATH"))
    if found:
        return found
    if os.access(_WELL_KNOWN_GO, os.X_OK):
        return str(_WELL_KNOWN_GO)
    raise BuildError(
        "go not found: install Go {}.{} or newer and put it on PATH "
        "(or set SPECDECODE_GO=/path/to/go)".format(*MINIMUM_GO)
    )


def check_go_version(go: str) -> tuple[int, int, int]:
    try:
        output = subprocess.run([go, "version"], capture_output=True, text=True, check=True,
                                env=go_environment(os.environ), timeout=60).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        raise BuildError(f"`{go} version` failed: {err}") from err
    version = parse_go_version(output)
    if version[:2] < MINIMUM_GO:
        raise BuildError(
            "Go {}.{} or newer is needed to build the local control plane, found {}: "
            "install a newer Go (GOTOOLCHAIN=local forbids downloading one)".format(
                *MINIMUM_GO, ".".join(map(str, version)))
        )
    return version


def _read_sources(builder_dir: Path) -> dict[str, bytes]:
    return {
        path.name: path.read_bytes()
        for path in sorted(builder_dir.iterdir())
        if path.is_file() and (path.name in ("go.mod", "go.sum") or path.suffix == ".go")
    }


def _goos_goarch() -> str:
    machine = os.uname().machine
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return f"{sys.platform}/{arch}"


def plan_builds(cache_root: Path | None = None, gobuild_root: Path = GOBUILD_ROOT) -> list[ComponentBuild]:
    """Plan every component's build from the builder modules shipped with the package."""
    cache_root = cache_root or default_cache_root()
    build_date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return [
        plan_component(spec, gobuild_root / spec.name, _read_sources(gobuild_root / spec.name),
                       cache_root, _goos_goarch(), build_date)
        for spec in COMPONENTS
    ]


def is_cached(build: ComponentBuild) -> bool:
    """True when every binary exists and was built from exactly these inputs."""
    try:
        info = json.loads(build.info_file.read_text())
    except (OSError, ValueError):
        return False
    return info.get("digest") == build.digest and all(
        os.access(build.binary(name), os.X_OK) for name in build.spec.binaries
    )


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Serialise builds of one component across processes (two test sessions, two shells)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class _GoRun:
    """Runs one `go` command, streaming its stderr lines to a callback, keeping the tail."""

    tail: deque[str] = field(default_factory=lambda: deque(maxlen=40))

    def run(self, command: Sequence[str], cwd: Path, env: Mapping[str, str], on_line) -> str:
        process = subprocess.Popen(
            list(command), cwd=cwd, env=dict(env), text=True, bufsize=1,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        lines: list[str] = []
        assert process.stdout is not None
        try:
            for raw in process.stdout:
                line = raw.rstrip("\n")
                lines.append(line)
                self.tail.append(line)
                on_line(line)
            returncode = process.wait()
        finally:
            # Interrupted (Ctrl-C, a test timeout): do not leave go compiling in the background.
            if process.poll() is None:
                process.kill()
                process.wait()
        if returncode != 0:
            raise BuildError(
                f"`{' '.join(command)}` failed (exit {returncode}) in {cwd}:\n" + "\n".join(self.tail)
            )
        return "\n".join(lines)


def _build_one(go: str, build: ComponentBuild, reporter: BuildReporter, go_version: str) -> None:
    env = go_environment(os.environ)
    runner = _GoRun()
    started = time.monotonic()

    def on_download_line(line: str) -> None:
        if line.startswith("go: downloading "):
            reporter.status(build, "downloading " + line.removeprefix("go: downloading "))

    reporter.status(build, "resolving packages")
    listing = runner.run(go_list_deps_command(go, build), build.builder_dir, env, on_download_line)
    packages = {line for line in listing.splitlines() if line and not line.startswith("go: ")}
    reporter.set_total(build, len(packages))

    def on_build_line(line: str) -> None:
        if line in packages:
            reporter.advance(build, line)
        else:
            on_download_line(line)

    staging = build.cache_dir.with_name(build.cache_dir.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    try:
        reporter.status(build, "compiling")
        runner.run(go_build_command(go, build, staging / "bin"), build.builder_dir, env, on_build_line)
        missing = [name for name in build.spec.binaries if not (staging / "bin" / name).exists()]
        if missing:
            raise BuildError(f"go build of {build.spec.name} produced no {', '.join(missing)}")
        (staging / "build-info.json").write_text(json.dumps({
            "component": build.spec.name,
            "version": build.version,
            "digest": build.digest,
            "go": go_version,
            "built_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(time.monotonic() - started, 1),
            "binaries": list(build.spec.binaries),
        }, indent=2) + "\n")
        # Swap in whole: a crash mid-build never leaves a cache directory that looks complete.
        shutil.rmtree(build.cache_dir, ignore_errors=True)
        staging.rename(build.cache_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_binaries(progress: bool = True, cache_root: Path | None = None, rebuild: bool = False) -> Binaries:
    """Return the stack's binaries, building (only) the components whose cache misses.

    `progress` shows a live display on a terminal and plain lines otherwise (CI logs);
    `rebuild` ignores the cache.
    """
    builds = plan_builds(cache_root)
    missing = [build for build in builds if rebuild or not is_cached(build)]
    with make_reporter(progress) as reporter:
        for build in builds:
            if build not in missing:
                reporter.cached(build)
        if missing:
            go = find_go()
            go_version = "go" + ".".join(map(str, check_go_version(go)))
            for build in missing:
                with _exclusive(build.cache_dir.with_name(f".{build.cache_dir.name}.lock")):
                    # Another process may have finished this build while we waited for the lock.
                    if not rebuild and is_cached(build):
                        reporter.cached(build)
                        continue
                    reporter.begin(build)
                    started = time.monotonic()
                    _build_one(go, build, reporter, go_version)
                    reporter.finish(build, time.monotonic() - started)
    return binaries_from(builds)


def binaries_from(builds: Sequence[ComponentBuild]) -> Binaries:
    by_name = {build.spec.name: build for build in builds}
    kubernetes, etcd, kwok, helm = (by_name[spec.name] for spec in (KUBERNETES, ETCD, KWOK, HELM))
    return Binaries(
        kube_apiserver=kubernetes.binary("kube-apiserver"),
        kube_controller_manager=kubernetes.binary("kube-controller-manager"),
        kube_scheduler=kubernetes.binary("kube-scheduler"),
        kubectl=kubernetes.binary("kubectl"),
        etcd=etcd.binary("etcd"),
        kwok=kwok.binary("kwok"),
        kwokctl=kwok.binary("kwokctl"),
        helm=helm.binary("helm"),
        kubernetes_version=kubernetes.version,
        etcd_version=etcd.version,
        kwok_version=kwok.version,
        helm_version=helm.version,
    )


def cached_binaries(cache_root: Path | None = None) -> Binaries | None:
    """The binaries if all are cached, else None (never builds)."""
    builds = plan_builds(cache_root)
    return binaries_from(builds) if all(is_cached(build) for build in builds) else None


def cached_binary(component: str, binary: str, cache_root: Path | None = None) -> Path | None:
    """One cached binary (say helm, for offline chart tests) whatever the other components' state."""
    for build in plan_builds(cache_root):
        if build.spec.name == component and is_cached(build):
            return build.binary(binary)
    return None
