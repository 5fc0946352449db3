"""The user's engine settings and the command-line flags that set them.

Each setting is declared once, as a field of :class:`plugins.config.EngineSettings` (name,
type, default, help, flag spellings, choices); this module derives from those declarations
the flags of ``core serve`` and ``core bench throughput`` and the settings a parsed command
line gives. :func:`core.resolve.resolve_engine` validates and settles them once into the
read-only :class:`plugins.EngineConfigView`.
"""

from __future__ import annotations

import argparse
import typing
from dataclasses import dataclass
from typing import Any

from plugins import EnvVar, Platform
from plugins.config import EngineSettings, declared_settings


@dataclass(frozen=True)
class EngineConfig(EngineSettings):
    """Settings of one engine: every declared setting (:class:`plugins.config.EngineSettings`);
    ``device`` may also be a :class:`plugins.Platform` class or instance."""

    device: str | Platform | type[Platform] = EngineSettings.device  # its declared default


def add_engine_args(parser: argparse.ArgumentParser, settings: type[EngineSettings] = EngineSettings) -> None:
    """Add to ``parser`` a flag for each setting that ``settings`` declares (vLLM's spellings)."""
    hints = typing.get_type_hints(settings)
    for field, how in declared_settings(settings):
        kind = _scalar_type(hints[field.name])
        flags = how.flags or ("--" + field.name.replace("_", "-"),)
        default, help_text = field.default, how.help
        if how.env is not None:
            default = EnvVar(how.env, how.parse or kind, default, how.help, how.choices).read()
            help_text = f"{how.help} (also CORE_{how.env})"
        if kind is bool:
            # a setting that is on by default needs its --no- spelling to be turned off
            action = argparse.BooleanOptionalAction if field.default else "store_true"
            parser.add_argument(*flags, dest=field.name, action=action, default=default, help=help_text)
            continue
        value: dict[str, Any] = {"type": how.parse or (None if kind is str else kind), "choices": how.choices}
        if how.positional:
            parser.add_argument(field.name, nargs="?", default=default, help=help_text, **value)
            parser.add_argument(*flags, dest=f"{field.name}_flag", default=None, help=argparse.SUPPRESS, **value)
        else:
            parser.add_argument(*flags, dest=field.name, default=default, help=help_text, metavar=how.metavar, **value)


def settings_from_args(args: argparse.Namespace, settings: type[EngineSettings] = EngineSettings) -> dict[str, Any]:
    """``{name: value}`` for each setting ``settings`` declares, from flags parsed with :func:`add_engine_args`."""
    values = {}
    for field, how in declared_settings(settings):
        value = getattr(args, field.name)
        # vLLM's `serve MODEL`, or the flag
        values[field.name] = (value or getattr(args, f"{field.name}_flag")) if how.positional else value
    return values


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Build an :class:`EngineConfig` from parsed :func:`add_engine_args` flags."""
    return EngineConfig(**settings_from_args(args))


def _scalar_type(hint: Any) -> Any:
    """``int`` for ``int | None``: the type a flag's text becomes."""
    (kind,) = [arg for arg in typing.get_args(hint) if arg is not type(None)] or [hint]
    return kind
