"""Declared environment-variable configuration for platforms.

Every variable a platform reads is declared once as an :class:`EnvVar` so that
``core devices --env`` can list it and a bad value fails with a message that names
the variable. Variables are read as ``CORE_<NAME>``; the ``VLLM_<NAME>`` spelling is
accepted as a fallback so that vLLM deployment recipes keep working.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "CORE_"
FALLBACK_PREFIX = "VLLM_"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class EnvConfigError(ValueError):
    """An environment variable holds a value its declaration does not accept."""


def parse_bool(text: str) -> bool:
    """Parse ``1/true/yes/on`` and ``0/false/no/off`` (case-insensitive)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE - {''})}")


def parse_int_list(text: str) -> tuple[int, ...]:
    """Parse a comma-separated list of integers, e.g. ``1,2,4,8``."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError("expected a comma-separated list of integers")
    return tuple(int(item) for item in items)


def parse_fraction(text: str) -> float:
    """A share in ``(0, 1]``, e.g. of device memory."""
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"expected a fraction in (0, 1], got {value}")
    return value


def parse_share(text: str) -> float:
    """A share in ``[0, 1]`` (0 allowed: none of it)."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"expected a number between 0 and 1, got {value}")
    return value


_PARSERS: dict[Any, Callable[[str], Any]] = {bool: parse_bool, int: int, float: float, str: str}


@dataclass(frozen=True)
class EnvVar:
    """One environment variable a platform reads.

    :param name: the name without prefix, e.g. ``"CPU_KVCACHE_SPACE"``; read from
        ``CORE_CPU_KVCACHE_SPACE``, else ``VLLM_CPU_KVCACHE_SPACE``.
    :param type: ``bool``, ``int``, ``float``, ``str`` or a callable that parses the
        text and raises ``ValueError`` on a bad value.
    :param default: the value when the variable is unset (not parsed).
    :param help: one line for ``core devices --env``.
    :param choices: the accepted values, if the set is closed.
    """

    name: str
    type: Any
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None

    @property
    def env_name(self) -> str:
        return PREFIX + self.name

    @property
    def fallback_name(self) -> str:
        return FALLBACK_PREFIX + self.name

    def raw(self, environ: Mapping[str, str]) -> tuple[str, str] | None:
        """Return ``(variable name, text)`` of the spelling that is set, or None."""
        for key in (self.env_name, self.fallback_name):
            if key in environ:
                return key, environ[key]
        return None

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        """Return the parsed value, or the default when unset.

        :raises EnvConfigError: naming the variable, the value and what was expected.
        """
        found = self.raw(os.environ if environ is None else environ)
        if found is None:
            return self.default
        key, text = found
        parser = _PARSERS.get(self.type, self.type)
        try:
            value = parser(text)
        except (TypeError, ValueError) as exc:
            expected = getattr(self.type, "__name__", str(self.type))
            raise EnvConfigError(f"{key}={text!r} is not a valid {expected}: {exc}") from None
        if self.choices is not None and value not in self.choices:
            choices = ", ".join(map(str, self.choices))
            raise EnvConfigError(f"{key}={text!r} is not one of: {choices}")
        return value


def read_env(variables: tuple[EnvVar, ...], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Parse every declared variable into ``{name: value}``; the first bad one raises."""
    return {var.name: var.read(environ) for var in variables}
