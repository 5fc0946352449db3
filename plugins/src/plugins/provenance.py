"""Which copy of a backend a test run imports, and whether it is the source being edited.

``pip install ./my_plugin`` (not ``-e``) copies the sources into site-packages, and
``pytest tests/`` then imports that copy: edits to the source tree reach the tests only
after the next install. :func:`tested_copy` finds the file a platform class was imported
from and compares its package with the source trees it could have come from: the
directory the distribution was installed from (its ``direct_url.json``) and the root of
the test run (``<root>/<pkg>`` or ``<root>/src/<pkg>``). A source copy whose ``.py``
files differ from the imported ones makes the copy stale.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from plugins.hookspecs import ENTRY_POINT_GROUP


@dataclass(frozen=True)
class TestedCopy:
    """Where a platform class was imported from and how it relates to its source tree."""

    __test__ = False  # not a pytest test class

    #: ``module.Class`` of the platform and the file that defines it
    qualname: str
    module_file: Path | None
    #: ``"name version"`` of the installed distribution that provides the package, if any
    distribution: str | None
    #: whether that distribution is an editable install (None: not installed as one)
    editable: bool | None
    #: the directory a non-editable install was made from, when it was a local directory
    installed_from: Path | None
    #: the other copy of the package compared with, and its files that differ from the imported copy
    source: Path | None
    stale: tuple[str, ...]

    def describe(self) -> str:
        """One line: the class, its file, how it is installed, and whether it is stale."""
        if self.distribution is None:
            how = "not an installed distribution"
        elif self.editable:
            how = f"{self.distribution}, editable install"
        else:
            origin = f" from {self.installed_from}" if self.installed_from else ""
            how = f"{self.distribution}, installed{origin}, not editable: reinstall after each edit"
        line = f"tests {self.qualname} from {self.module_file or 'a module without a file'} ({how})"
        if self.stale:
            line += f"; STALE: differs from {self.source} in {', '.join(self.stale)}"
        return line


def _package_root(top: str) -> Path | None:
    """The imported copy of package ``top``: its directory, or the file of a single module."""
    module = sys.modules.get(top)
    file = getattr(module, "__file__", None)
    if file is None:
        return None
    path = Path(file).resolve()
    return path.parent if path.name == "__init__.py" else path


def _source_copy(tree: Path, top: str) -> Path | None:
    """``tree/[src/]top/`` (a package with ``__init__.py``) or ``tree/[src/]top.py``, if present."""
    for base in (tree, tree / "src"):
        if (base / top / "__init__.py").is_file():
            return (base / top).resolve()
        if (base / f"{top}.py").is_file():
            return (base / f"{top}.py").resolve()
    return None


def _py_files(root: Path) -> dict[str, Path]:
    if root.is_file():
        return {root.name: root}
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*.py"))}


def _differing(source: Path, tested: Path) -> tuple[str, ...]:
    """The ``.py`` files of ``source`` that ``tested`` lacks or holds with other content."""
    tested_files = _py_files(tested)
    return tuple(
        rel
        for rel, path in _py_files(source).items()
        if rel not in tested_files or tested_files[rel].read_bytes() != path.read_bytes()
    )


def _installed_record(dist: importlib.metadata.Distribution) -> importlib.metadata.Distribution | None:
    """The installer's record of ``dist``'s project; None when only a build left metadata.

    ``pip install -e .`` (or any build) leaves setuptools' ``<name>.egg-info`` in the source
    folder; where that folder is on ``sys.path`` (``python -m pytest`` run in it) the egg-info
    shadows the install's ``dist-info``, which alone holds ``direct_url.json``. An installer
    writes ``INSTALLER``; a build does not.
    """
    records = importlib.metadata.distributions(name=dist.metadata["Name"])
    return next((record for record in records if record.read_text("INSTALLER")), None)


def _install(top: str) -> tuple[str | None, bool | None, Path | None]:
    """``(name version, editable, local source directory)`` of the distribution providing ``top``."""
    dist = next(
        (ep.dist for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.module.split(".")[0] == top),
        None,
    )  # the distribution whose entry point the engine loads; else whichever ships the package
    if dist is None:
        names = importlib.metadata.packages_distributions().get(top)
        if not names:
            return None, None, None
        dist = importlib.metadata.distribution(names[0])
    dist = _installed_record(dist)
    if dist is None:
        return None, None, None
    label = f"{dist.metadata['Name']} {dist.version}"
    text = dist.read_text("direct_url.json")
    if not text:
        return label, False, None  # installed from an index or a wheel file
    info = json.loads(text)
    dir_info = info.get("dir_info")
    if dir_info is None:
        return label, False, None
    url = urlparse(info.get("url", ""))
    source = Path(unquote(url.path)) if url.scheme == "file" else None
    return label, bool(dir_info.get("editable")), source


def tested_copy(platform_class: type, root: Path | None = None) -> TestedCopy:
    """Describe the copy of ``platform_class``'s package that is imported.

    :param root: the test run's root directory, a second place to look for a source tree.
    """
    top = platform_class.__module__.split(".")[0]
    file = getattr(sys.modules.get(platform_class.__module__), "__file__", None)
    module_file = Path(file).resolve() if file else None
    distribution, editable, installed_from = _install(top)
    imported = _package_root(top)
    source, stale = None, ()
    candidates = [installed_from if not editable else None, root]
    for tree in (t for t in candidates if t is not None):
        copy = _source_copy(tree, top)
        if copy is not None and imported is not None and copy != imported:
            source, stale = copy, _differing(copy, imported)
            if stale:
                break
    return TestedCopy(
        qualname=f"{platform_class.__module__}.{platform_class.__qualname__}",
        module_file=module_file,
        distribution=distribution,
        editable=editable,
        installed_from=installed_from if not editable else None,
        source=source,
        stale=stale,
    )
