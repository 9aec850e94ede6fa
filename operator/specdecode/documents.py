"""Reading what the CLI is given: files, folders and multi-document YAML, strictly.

The one reader of `validate`, `render` (and `diagnose --spec`): a path is a file, `-` for
standard input, or a folder (every *.yaml / *.yml below it, hidden ones and Helm charts
skipped). A file must be UTF-8 and YAML without a repeated key; anything else is an
`UnreadableInput` naming the file and the place.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .cli import UnreadableInput

YAML_SUFFIXES = (".yaml", ".yml")
HELM_CHART_FILE = "Chart.yaml"


@dataclass(frozen=True)
class Document:
    """One non-empty YAML document of a file; `index` counts from 1 among the file's documents."""

    file: str
    index: int
    count: int
    body: Any

    @property
    def where(self) -> str:
        return self.file if self.count == 1 else f"{self.file}: document {self.index}"


@dataclass
class Files:
    """The YAML files a list of paths names, and the Helm chart folders skipped on the way."""

    files: list[str] = field(default_factory=list)
    explicit: set[str] = field(default_factory=set)  # named on the command line (not found in a folder)
    skipped_charts: list[str] = field(default_factory=list)


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def find_files(paths: list[str]) -> Files:
    """Every file `paths` names, in order: a file or `-` as given, a folder's YAML files sorted.

    A folder holding Chart.yaml is a Helm chart: its templates are Go templates, not YAML, so
    it is skipped (and listed in `skipped_charts`) wherever it lies below a given folder.
    """
    found = Files()
    for given in paths:
        root = Path(given)
        if given == "-" or not root.is_dir():
            found.files.append(given)
            found.explicit.add(given)
            continue
        charts = sorted(c.parent for c in root.rglob(HELM_CHART_FILE) if not _hidden(c, root))
        found.skipped_charts += [str(c) for c in charts]
        files = sorted(
            str(f) for f in root.rglob("*")
            if f.suffix in YAML_SUFFIXES and f.is_file() and not _hidden(f, root)
            and not any(f.is_relative_to(c) for c in charts)
        )
        if not files and not charts:
            raise UnreadableInput(f"{given}: no *.yaml or *.yml file in the folder; check the path")
        found.files += files
    return found


def read_text(path: str) -> str:
    """The text of a file (`-`: standard input), which must be UTF-8 (a byte-order mark is allowed)."""
    try:
        if path == "-":
            stream = getattr(sys.stdin, "buffer", None)
            data = stream.read() if stream is not None else sys.stdin.read().encode()
        else:
            data = Path(path).read_bytes()
    except OSError as err:
        raise UnreadableInput(f"{path}: cannot read the file ({err.strerror}); check the path") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise UnreadableInput(
            f"{path}: not UTF-8: byte 0x{data[err.start]:02x} at line {line}, column {column} "
            f"(byte {err.start}); save the file as UTF-8"
        ) from None


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping repeating a key (PyYAML would keep the last one
    silently; kubectl refuses the file)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue  # SafeLoader refuses it with its own message
                line = key_node.start_mark.line + 1
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        None, None,
                        f"duplicate key {key!r} (first at line {first_line[key]}); keep one of them",
                        key_node.start_mark,
                    )
                first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_documents(text: str, path: str) -> list[Document]:
    """The non-empty YAML documents of `text`, read strictly; UnreadableInput naming the place."""
    try:
        bodies = [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "malformed YAML"
        raise UnreadableInput(f"{path}: not valid YAML{where}: {problem}") from None
    return [Document(path, index, len(bodies), body) for index, body in enumerate(bodies, 1)]


def read_documents(path: str) -> list[Document]:
    """The non-empty YAML documents of one file (`-`: standard input)."""
    return parse_documents(read_text(path), path)
