"""Plug-ins (agent, synthesizer, embedder, ...): found by entry-point name or `module:factory`.

`REM_AGENT=offline` names an entry point in the `rem.agents` group (rem's
own are declared in pyproject.toml; an installed package adds its own the
same way); `REM_AGENT=mypkg.agents:make` names a factory directly. Either
way the factory is called with no arguments. Anything that goes wrong is
one `PluginError` line naming the variable, what was tried and the fix.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from backend.core.errors import UsageError


class PluginError(UsageError):
    """A plug-in spec that names nothing loadable."""


def installed(group: str) -> list[str]:
    """The entry-point names installed in `group`, sorted."""
    return sorted(ep.name for ep in entry_points(group=group))


def load_factory(group: str, spec: str, variable: str) -> Any:
    """The factory `spec` names: an entry point in `group`, or `module:attribute`."""
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise PluginError(
                f"{variable}={spec!r} cannot be loaded ({type(exc).__name__}: {exc}); "
                "check the module:factory name and that its package is installed"
            ) from None
    found = [ep for ep in entry_points(group=group) if ep.name == spec]
    if not found:
        names = ", ".join(installed(group)) or "none"
        raise PluginError(
            f"{variable}={spec!r} cannot be loaded: no plug-in of that name in {group} "
            f"(installed: {names}); use one of those, or module:factory"
        )
    try:
        return found[0].load()
    except (ImportError, AttributeError) as exc:
        raise PluginError(
            f"{variable}={spec!r} cannot be loaded ({type(exc).__name__}: {exc}); reinstall the package that provides it"
        ) from None


def load_plugin(group: str, spec: str, variable: str) -> Any:
    """A new instance of the plug-in `spec` names (its factory called with no arguments)."""
    factory = load_factory(group, spec, variable)
    try:
        return factory()
    except Exception as exc:  # a plug-in's own failure to start: one line, not its traceback
        raise PluginError(f"{variable}={spec!r} failed to start ({type(exc).__name__}: {exc})") from exc
