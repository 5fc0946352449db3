"""The kit's checks of what a platform says about itself: members, version, availability, entry point, env."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pluggy
import pytest
from plugins import hookspecs
from plugins.env import EnvConfigError, EnvVar
from plugins.hookspecs import ENTRY_POINT_GROUP
from plugins.platform import PLATFORM_API_VERSION, Platform, missing_members
from plugins.testing.base import ConformanceBase
from plugins.testing.report import tested_copy_of


def _hook_results(module: Any) -> list[Any]:
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    manager.register(module)
    return manager.hook.register_platform()


def _top_package(module_name: str) -> str:
    return module_name.split(".")[0]


def _bad_text(var: EnvVar) -> str | None:
    """A value the variable must reject, or None if any text is acceptable."""
    if var.choices is not None:
        return "definitely-not-a-choice"
    if var.type in (int, float, bool):
        return "not-a-number"
    return None


class IdentityChecks(ConformanceBase):
    """Identity, API version, availability, the installed entry point and the env variables."""

    def test_identity(self, plat: Platform) -> None:
        assert isinstance(plat, Platform)
        missing = missing_members(type(plat))
        assert not missing, f"{type(plat).__name__} lacks the required {', '.join(missing)} of plugins.Platform"
        assert isinstance(plat.name, str) and plat.name.isidentifier(), f"name {plat.name!r} must be an identifier"
        assert isinstance(plat.device_type, str) and plat.device_type, "device_type must be a torch device type"
        assert isinstance(plat.priority, int)
        assert plat.supported_dtypes, "supported_dtypes must not be empty"
        assert set(plat.supported_dtypes) <= {"float32", "bfloat16", "float16"}
        assert isinstance(plat.ray_device_key, str) and plat.ray_device_key, "ray_device_key names a Ray resource"

    def test_api_version(self, plat: Platform) -> None:
        wanted = plat.api_version
        assert wanted is None or wanted == PLATFORM_API_VERSION, (
            f"{type(plat).__name__}.api_version is {wanted}, but this SDK provides PLATFORM_API_VERSION "
            f"{PLATFORM_API_VERSION}: port the platform to version {PLATFORM_API_VERSION} (plugins/README.md)"
        )

    def test_entry_point_hook(self, plat: Platform) -> None:
        """The installed distribution's ``core.platforms`` entry point returns this platform."""
        top = _top_package(type(plat).__module__)
        if top == "plugins":
            pytest.skip("a platform of the SDK itself has no entry point")
        points = [
            ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if _top_package(ep.module) == top
        ]
        if not points:
            dists = importlib.metadata.packages_distributions().get(top)
            assert not dists, (
                f"distribution {dists} provides {top!r} but registers no {ENTRY_POINT_GROUP!r} entry point"
            )
            pytest.skip(f"{top!r} is not installed as a distribution: no entry point to check")
        returned = [result for ep in points for result in _hook_results(ep.load())]
        for result in returned:
            cls = result if isinstance(result, type) else type(result)
            assert issubclass(cls, Platform), f"register_platform() returned {result!r}, not a plugins.Platform"
        assert any(isinstance(plat, r if isinstance(r, type) else type(r)) for r in returned), (
            f"the entry points {[ep.value for ep in points]} of {ENTRY_POINT_GROUP!r} return {returned}, "
            f"not {type(plat).__name__}"
        )

    def test_tested_copy_is_the_source(self, plat: Platform, request: pytest.FixtureRequest) -> None:
        """The imported copy of the package is the source tree it was installed from / the run's root."""
        copy = tested_copy_of(type(plat), request.config.rootpath)
        assert not copy.stale, (
            f"the kit imports {copy.module_file}, not the source you edit: {copy.source} differs in "
            f"{', '.join(copy.stale)}. Reinstall it, or install it editable (pip install -e), then rerun"
        )

    def test_availability_contract(self, plat: Platform) -> None:
        available = plat.is_available()
        assert isinstance(available, bool), "is_available() must return a bool"
        reason = plat.unavailable_reason()
        if available:
            assert reason is None, "an available platform has no unavailable_reason()"
            assert isinstance(plat.device_info(), dict)
        else:
            assert isinstance(reason, str) and reason.strip(), "an unavailable platform must say why"

    def test_unknown_extension_is_none(self, plat: Platform) -> None:
        """``get_extension`` answers None for a name the platform does not provide."""
        assert plat.get_extension("no-such-extension") is None

    def test_env_defaults(self, plat: Platform) -> None:
        names = [var.name for var in plat.env_vars]
        assert len(names) == len(set(names)), f"duplicate env variables: {names}"
        values = plat.read_env({})
        for var in plat.env_vars:
            assert values[var.name] == var.default
            assert var.help, f"{var.env_name} needs a help text"

    def test_env_good_values_and_fallback(self, plat: Platform) -> None:
        for var in plat.env_vars:
            if var.default is None:
                continue
            text = ",".join(map(str, var.default)) if isinstance(var.default, tuple) else str(var.default)
            assert plat.read_env({var.env_name: text})[var.name] == var.default
            assert plat.read_env({var.fallback_name: text})[var.name] == var.default

    def test_env_bad_values_name_the_variable(self, plat: Platform) -> None:
        for var in plat.env_vars:
            bad = _bad_text(var)
            if bad is None:
                continue
            with pytest.raises(EnvConfigError, match=var.env_name):
                plat.read_env({var.env_name: bad})
