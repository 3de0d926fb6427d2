"""A real-text corpus that needs no download: the docstrings of installed Python code.

Each example is one docstring (module, class or function) read with ``ast`` from the source
files of a package (nothing is imported or run), labelled by the package it documents. The
standard library is one class. Names that give the answer away (``numpy``, ``np``, ``torch``,
...) are masked, and doctest lines (``>>>``, ``...``) are dropped, so the model has to read
the prose. The corpus depends only on the installed versions of the packages.

``collect`` parses every source file (tens of seconds for all classes); with a
``cache_dir`` it keeps each package's docstrings in a JSON file keyed by its version.

The split is fixed by content: a docstring goes to ``test`` if ``sha1(text) % 10 == 0``,
to ``val`` if it is 1, else to ``train``; a class keeps its ``per_class`` docstrings of
smallest hash after duplicates (the same text under two labels included) are dropped.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LABELS", "Docstring", "collect", "split_of", "package_dir"]

#: class name -> (where its sources are, names masked in its text). "stdlib" is special.
LABELS: dict[str, tuple[str, ...]] = {
    "stdlib": (),
    "numpy": ("numpy", "np"),
    "scipy": ("scipy",),
    "sklearn": ("sklearn", "scikit-learn", "scikit"),
    "pandas": ("pandas", "pd"),
    "sympy": ("sympy",),
    "torch": ("torch", "pytorch"),
    "transformers": ("transformers", "huggingface", "hf"),
    "matplotlib": ("matplotlib", "mpl", "plt", "pyplot"),
    "networkx": ("networkx", "nx"),
}
_MASK = "pkg"
_MASKED = re.compile(r"\b(" + "|".join(n for names in LABELS.values() for n in names) + r")\b", re.I)
_SKIP_DIRS = {"tests", "test", "testing", "site-packages", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip"}


@dataclass(frozen=True)
class Docstring:
    """One example: the cleaned ``text``, its class index ``label`` and where it came from."""

    text: str
    label: int
    source: str  # "path/inside/package.py:QualName"


def package_dir(label: str) -> Path:
    """Folder of the sources of class ``label``; ValueError if unknown, ImportError if missing."""
    if label not in LABELS:
        raise ValueError(f"unknown docstring class {label!r}; known: {list(LABELS)}")
    if label == "stdlib":
        return Path(sysconfig.get_paths()["stdlib"])
    spec = importlib.util.find_spec(label)
    if spec is None or spec.origin is None:
        raise ImportError(f"the docstring class {label!r} needs the package {label!r} installed "
                          "(pip install -e '.[examples]')")
    return Path(spec.origin).parent


def clean(docstring: str, max_chars: int = 600) -> str:
    """Doctest lines dropped, package names masked, whitespace collapsed, cut at ``max_chars``."""
    lines = [line for line in docstring.splitlines() if not line.lstrip().startswith((">>>", "..."))]
    text = " ".join(" ".join(lines).split())
    return _MASKED.sub(_MASK, text)[:max_chars]


def split_of(text: str) -> str:
    """``"train"``, ``"val"`` or ``"test"``, from the text alone (see the module doc)."""
    bucket = _digest(text) % 10
    return "test" if bucket == 0 else "val" if bucket == 1 else "train"


def collect(labels: tuple[str, ...] = tuple(LABELS), per_class: int = 800, min_chars: int = 60,
            cache_dir: Path | None = None) -> list[Docstring]:
    """``per_class`` cleaned docstrings of at least ``min_chars`` characters for each label.

    cache_dir: keep each package's parsed docstrings there (keyed by its version), so only
    the first call parses. Raises ValueError naming the classes with fewer than ``per_class``.
    """
    if len(set(labels)) != len(labels) or len(labels) < 2:
        raise ValueError(f"labels must be at least two distinct classes, got {list(labels)}")
    found = {label: _cached(label, min_chars, cache_dir) for label in labels}
    owners: dict[str, set[str]] = {}
    for label, texts in found.items():
        for text in texts:
            owners.setdefault(text, set()).add(label)
    examples, short = [], {}
    for index, label in enumerate(labels):
        unique = sorted((t for t in found[label] if len(owners[t]) == 1), key=_digest)
        if len(unique) < per_class:
            short[label] = len(unique)
        examples += [Docstring(t, index, found[label][t]) for t in unique[:per_class]]
    if short:
        raise ValueError(f"fewer than per_class={per_class} docstrings in {short}: lower per_class")
    return examples


def _cached(label: str, min_chars: int, cache_dir: Path | None) -> dict[str, str]:
    """``_docstrings`` of ``label``'s package, read from or written to ``cache_dir``."""
    root = package_dir(label)
    if cache_dir is None:
        return _docstrings(root, min_chars)
    version = platform.python_version() if label == "stdlib" else _version(label)
    path = Path(cache_dir).expanduser() / f"docstrings-{label}-{version}-{min_chars}-{_digest(str(root)):016x}.json"
    if path.exists():
        return json.loads(path.read_text())
    found = _docstrings(root, min_chars)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(found))
    partial.replace(path)  # atomic: a process started beside this one reads the whole file or none
    return found


def _version(label: str) -> str:
    return importlib.metadata.version("scikit-learn" if label == "sklearn" else label)


def _docstrings(root: Path, min_chars: int) -> dict[str, str]:
    """Cleaned text -> its first source, over the ``.py`` files under ``root`` (sorted)."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if _SKIP_DIRS.intersection(relative.parts[:-1]) or relative.name.startswith("test_"):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue
        for node, name in _documented(tree):
            raw = ast.get_docstring(node)
            text = clean(raw) if raw else ""
            if len(text) >= min_chars and text not in out:
                out[text] = f"{relative}:{name}"
    return out


def _documented(tree: ast.Module):
    """(node, qualified name) of the module and of every class and function in it."""
    yield tree, "<module>"
    stack = [(child, "") for child in tree.body]
    while stack:
        node, prefix = stack.pop()
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            yield node, name
            stack += [(child, name + ".") for child in node.body]


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "little")
