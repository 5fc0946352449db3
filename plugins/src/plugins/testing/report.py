"""The kit's pytest hooks: name the copy of a platform's package that the checks test."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from plugins.provenance import TestedCopy, tested_copy
from plugins.testing.base import ConformanceBase


@functools.cache
def tested_copy_of(platform_class: type, root: Path) -> TestedCopy:
    """Where ``platform_class`` is imported from, and how its package is installed (cached per run)."""
    return tested_copy(platform_class, root)


def _platform_class(item: pytest.Item) -> type | None:
    cls = getattr(item, "cls", None)
    if cls is None or not issubclass(cls, ConformanceBase) or cls.platform is None:
        return None
    return cls.platform if isinstance(cls.platform, type) else type(cls.platform)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Before the checks run, name the file each conformance class tests and how it is installed."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    classes = dict.fromkeys(c for c in map(_platform_class, session.items) if c is not None)
    for platform_class in classes if reporter is not None else ():
        reporter.write_line(f"conformance kit: {tested_copy_of(platform_class, session.config.rootpath).describe()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """A failed check of the kit names the tested copy in its report."""
    outcome = yield
    report = outcome.get_result()
    platform_class = _platform_class(item)
    if report.failed and platform_class is not None:
        report.sections.append(("conformance kit", tested_copy_of(platform_class, item.config.rootpath).describe()))
