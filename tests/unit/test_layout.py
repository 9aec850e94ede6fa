"""The package layout: the runtime (api, render, control, shell, the `specdecode` command)
never imports the tools (specdecode/tools/: simulator, benchmark, demo, local stack), so the
operator image, built without them, runs; the tool commands say how to install what they lack."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "specdecode"
TOOL_ONLY = ("specdecode.tools", "rich", "matplotlib", "numpy")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module, imported at module level) for every import in a file, relative ones
    resolved; `from X import y` also yields X.y (y may be a submodule)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                found.append((base, top))
                found.extend((f"{base}.{alias.name}", top) for alias in child.names)
            visit(child, inner)

    visit(ast.parse(path.read_text()), True)
    return found


def _is_tool(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in TOOL_ONLY)


RUNTIME_FILES = sorted(p for p in PACKAGE.rglob("*.py") if "tools" not in p.relative_to(PACKAGE).parts)


def test_the_tools_are_a_subpackage_and_the_runtime_has_modules():
    assert (PACKAGE / "tools" / "__init__.py").is_file()
    for package in ("render", "control", "shell", "tools/sim", "tools/bench", "tools/localstack"):
        assert (PACKAGE / package / "__init__.py").is_file(), package
    assert len(RUNTIME_FILES) > 20


@pytest.mark.parametrize("path", RUNTIME_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_runtime_never_imports_the_tools(path):
    """api, render, control, shell and the rest import nothing from the tools or their
    dependencies; the command modules only inside the tool commands' functions."""
    command_module = path.parent.name == "commands" or path.name in ("cli.py", "__main__.py")
    offending = [name for name, top in _imports(path) if _is_tool(name) and (top or not command_module)]
    assert not offending, f"{path.relative_to(PACKAGE)} imports {offending}"


def _runtime_wheel(tmp_path: Path) -> Path:
    """The operator image's install: a wheel of the tree without operator/specdecode/tools
    (excluded from its build context), installed without dependencies."""
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(REPO / "pyproject.toml", source)
    shutil.copy(REPO / "README.md", source)
    shutil.copytree(REPO / "operator", source / "operator",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "tools"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(wheels), str(source)], check=True, timeout=300, capture_output=True)
    (wheel,) = wheels.glob("specdecode_operator-*.whl")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--target", str(target), str(wheel)], check=True, timeout=300, capture_output=True)
    return target


# Runs in a fresh interpreter with the runtime wheel first on the path and the tool-only
# packages blocked: the operator image has neither.
BLOCKED = textwrap.dedent("""
    import importlib.abc, sys
    sys.path.insert(0, sys.argv[1])
    BLOCKED = ("specdecode.tools", "rich", "matplotlib", "numpy")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Block())
    import specdecode
    assert specdecode.__file__.startswith(sys.argv[1]), specdecode.__file__
    from specdecode.cli import main
    if sys.argv[2] == "import":
        import specdecode.shell.handlers, specdecode.commands.run
        print("imported")
        sys.exit(0)
    sys.exit(main(sys.argv[2:]))
""")


def test_runtime_wheel_runs_without_the_tools(tmp_path):
    site = _runtime_wheel(tmp_path)
    assert not (site / "specdecode" / "tools").exists()
    assert (site / "specdecode" / "control" / "data" / "h200-llama8b-1b-steptime.csv").is_file()

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", BLOCKED, str(site), *argv], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)

    imported = run("import")
    assert imported.returncode == 0 and "imported" in imported.stdout, imported.stderr
    helped = run("run", "--help")
    assert helped.returncode == 0 and "usage: specdecode run" in helped.stdout, helped.stderr
    for argv in (["bench", "policy"], ["sim", "--kubeconfig", "kubeconfig", "--scenario", "demo", "--targets-file", "targets"], ["cluster", "status"], ["demo"]):
        done = run(*argv)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, (argv, done.stderr)
        assert f"`specdecode {argv[0]}` needs the tools" in lines[0]
        assert "pip install 'specdecode-operator[tools]'" in lines[0]
