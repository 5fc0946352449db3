"""Discover backend plugins and select the platform to run on.

Each entry point of the group ``core.platforms`` is imported on its own, so a plugin
that fails to import is reported with its error and skipped without breaking the
others; ``CORE_PLUGINS=a,b`` restricts loading to those entry-point names. Hook
implementations are called one by one for the same reason, and selection never
depends on pluggy's call order: it is explicit (priority, then name).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import pluggy
import plugins
from plugins import PLATFORM_API_VERSION, Platform, PlatformUnavailable, PluginError, hookspecs
from plugins.hookspecs import ENTRY_POINT_GROUP, FIRST_PARTY_DEVICES

logger = logging.getLogger(__name__)


@dataclass
class PluginRecord:
    """One discovered plugin: its platform, or the error that kept it out."""

    name: str
    dist_name: str
    version: str
    platform: Platform | None = None
    error: str | None = None
    #: not loaded because ``CORE_PLUGINS`` does not name it
    left_out: bool = False
    _available: bool | None = field(default=None, repr=False)
    _reason: str | None = field(default=None, repr=False)

    @property
    def is_available(self) -> bool:
        """Whether the platform loaded and reports itself available (asked once)."""
        if self._available is None:
            self._available, self._reason = _probe(self)
        return self._available

    @property
    def reason(self) -> str | None:
        """Why the plugin cannot be used, or None when it can."""
        self.is_available  # noqa: B018 - fills the cached reason
        return self._reason


def _probe(record: PluginRecord) -> tuple[bool, str | None]:
    if record.platform is None:
        return False, record.error
    try:
        if record.platform.is_available():
            return True, None
        return False, record.platform.unavailable_reason() or "not available"
    except Exception as exc:  # a buggy is_available() must not hide the other plugins
        return False, f"is_available() raised {type(exc).__name__}: {exc}"


def _plugin_filter(environ: Mapping[str, str]) -> set[str] | None:
    text = environ.get("CORE_PLUGINS", "").strip()
    if not text:
        return None
    return {name.strip() for name in text.split(",") if name.strip()}


def _instantiate(result: object, entry_name: str) -> Platform:
    platform = result() if isinstance(result, type) else result
    if not isinstance(platform, Platform):
        raise PluginError(
            f"register_platform() of '{entry_name}' returned {result!r}, expected a plugins.Platform subclass"
        )
    if not platform.name:
        raise PluginError(f"platform of '{entry_name}' has no name")
    wanted = platform.api_version
    if wanted is not None and wanted != PLATFORM_API_VERSION:
        raise PluginError(
            f"platform '{platform.name}' was written for PLATFORM_API_VERSION {wanted}, "
            f"this engine provides {PLATFORM_API_VERSION}"
        )
    return platform


def discover(environ: Mapping[str, str] | None = None) -> list[PluginRecord]:
    """Load every plugin of the ``core.platforms`` group and return one record each, sorted by name.

    A plugin that ``CORE_PLUGINS`` leaves out is not imported; its record says so.
    """
    environ = os.environ if environ is None else environ
    wanted = _plugin_filter(environ)
    manager = pluggy.PluginManager(plugins.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    records: dict[str, PluginRecord] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in records:
            continue
        dist = ep.dist
        record = PluginRecord(
            name=ep.name,
            dist_name=dist.metadata["Name"] if dist is not None else "?",
            version=dist.version if dist is not None else "?",
        )
        records[ep.name] = record
        if wanted is not None and ep.name not in wanted:
            record.left_out = True
            record.error = f"not loaded: CORE_PLUGINS={environ['CORE_PLUGINS'].strip()} leaves it out"
            continue
        try:
            module = ep.load()
            manager.register(module, name=ep.name)
            impls = [impl for impl in manager.hook.register_platform.get_hookimpls() if impl.plugin_name == ep.name]
            if not impls:
                raise PluginError(f"module '{ep.value}' implements no register_platform hook")
            record.platform = _instantiate(impls[0].function(), ep.name)
        except Exception as exc:
            record.error = f"failed to load: {type(exc).__name__}: {exc}"
            logger.warning("plugin '%s' (%s) skipped: %s", ep.name, ep.value, record.error)
    if wanted is not None:
        for name in sorted(wanted - records.keys()):
            logger.warning("CORE_PLUGINS names '%s', which is not installed", name)
    return [records[name] for name in sorted(records)]


def select_platform(device: str, records: list[PluginRecord]) -> Platform:
    """Return the platform for ``--device`` (``auto`` or a plugin name).

    :raises PlatformUnavailable: with the reason, or the installed names and the pip
        command when the name is not installed.
    """
    by_name = {r.platform.name if r.platform else r.name: r for r in records}
    if device == "auto":
        usable = [r for r in records if r.is_available]
        if not usable:
            names_by_reason: dict[str, list[str]] = {}
            for r in records:
                names_by_reason.setdefault(r.reason or "not available", []).append(r.name)
            reasons = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in names_by_reason.items())
            if any(r.left_out for r in records):
                fix = "Name an installed plugin in CORE_PLUGINS, or unset it"
            else:
                fix = f"Install a backend: {_how_to_install()}"
            raise PlatformUnavailable(
                f"No available device for --device auto ({reasons or 'no plugin installed'}). {fix}"
            )
        chosen = min(usable, key=lambda r: (-r.platform.priority, r.platform.name))
        others = ", ".join(
            f"{r.name} ({'priority ' + str(r.platform.priority) if r.is_available else r.reason})"
            for r in records
            if r is not chosen
        )
        logger.info(
            "selected %s (priority %d); alternatives: %s",
            chosen.platform.name,
            chosen.platform.priority,
            others or "none",
        )
        return chosen.platform
    record = by_name.get(device)
    if record is None:
        installed = ", ".join(sorted(by_name)) or "none"
        if device in FIRST_PARTY_DEVICES:
            how = f"To add it: pip install plugin_{device}"
        else:
            close = difflib.get_close_matches(device, sorted({*by_name, *FIRST_PARTY_DEVICES}), n=1)
            guess = f"Did you mean '{close[0]}'? " if close else ""
            how = f"{guess}No backend of this project is called '{device}'; {_how_to_install()}"
        raise PlatformUnavailable(f"Unknown device '{device}'. Installed: {installed}. {how}")
    if not record.is_available:
        raise PlatformUnavailable(f"Device '{device}' is installed but unavailable: {record.reason}")
    logger.info("selected %s (requested by --device)", device)
    return record.platform


def _how_to_install() -> str:
    return (
        f"pip install plugin_<name> for one of this project's backends ({', '.join(FIRST_PARTY_DEVICES)}); "
        f"a third-party backend (a package with a '{ENTRY_POINT_GROUP}' entry point) comes with its own pip command"
    )
