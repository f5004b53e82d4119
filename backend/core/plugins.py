"""Plug-ins (agent, synthesizer, embedder, ...): found by entry-point name or `module:factory`.

`REM_AGENT=offline` names an entry point in the `rem.agents` group (rem's
own are declared in pyproject.toml; an installed package adds its own the
same way); `REM_AGENT=mypkg.agents:make` names a factory directly. Either
way the factory is called with no arguments. Anything that goes wrong is
one `PluginError` line naming the variable, what was tried and the fix:

* a name two installed packages both register is refused, naming both
  (which one Python would pick is an accident of install order);
* the plug-in a factory returns is checked against its Protocol when it is
  loaded, that is when the process that uses it starts: every member the
  Protocol declares is there, a method takes the arguments rem passes (and
  is async where the Protocol's is), a declared `str` or `int` is one. What
  is missing is named in the same line, instead of failing on first use.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from typing import TYPE_CHECKING, Any

from backend.core.errors import UsageError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint


class PluginError(UsageError):
    """A plug-in spec that names nothing loadable, or something that is not that kind of plug-in."""


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points installed in `group`."""
    # import time: importlib.metadata, only when a plug-in is looked up (not for `rem status`)
    from importlib import metadata

    return list(metadata.entry_points(group=group))


def installed(group: str) -> list[str]:
    """The entry-point names installed in `group`, sorted (a name two packages register, once)."""
    return sorted({ep.name for ep in entry_points(group=group)})


def _load_attribute(spec: str, variable: str) -> Any:
    """The attribute a `module:attribute` spec names, imported now."""
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PluginError(
            f"{variable}={spec!r} cannot be loaded ({type(exc).__name__}: {exc}); "
            "check the module:factory name and that its package is installed"
        ) from None


def _ambiguous(group: str, spec: str, variable: str, found: list[EntryPoint]) -> PluginError:
    shown = " and ".join(_provider(ep) for ep in found)
    return PluginError(
        f"{variable}={spec!r} is ambiguous: {len(found)} installed packages register {spec!r} in "
        f"{group}: {shown}; uninstall one of them, or name the factory itself (module:factory)"
    )


def load_factory(group: str, spec: str, variable: str) -> Any:
    """The factory `spec` names: an entry point in `group`, or `module:attribute`."""
    if ":" in spec:
        return _load_attribute(spec, variable)
    found = [ep for ep in entry_points(group=group) if ep.name == spec]
    if not found:
        names = ", ".join(installed(group)) or "none"
        raise PluginError(
            f"{variable}={spec!r} cannot be loaded: no plug-in of that name in {group} "
            f"(installed: {names}); use one of those, or module:factory"
        )
    if len(found) > 1:
        raise _ambiguous(group, spec, variable, found)
    try:
        return found[0].load()
    except (ImportError, AttributeError) as exc:
        raise PluginError(
            f"{variable}={spec!r} cannot be loaded ({type(exc).__name__}: {exc}); reinstall the package that provides it"
        ) from None


def _provider(ep: EntryPoint) -> str:
    """`package version (module:factory)`: which installed package registers this entry point."""
    dist = ep.dist
    package = f"{dist.name} {dist.version}" if dist is not None else "an unnamed package"
    return f"{package} ({ep.value})"


def load_plugin(group: str, spec: str, variable: str, protocol: type | None = None) -> Any:
    """A new instance of the plug-in `spec` names (its factory called with no arguments), checked
    against `protocol` when one is given."""
    factory = load_factory(group, spec, variable)
    try:
        plugin = factory()
    except Exception as exc:  # a plug-in's own failure to start: one line, not its traceback
        raise PluginError(f"{variable}={spec!r} failed to start ({type(exc).__name__}: {exc})") from exc
    if protocol is not None:
        problems = protocol_problems(plugin, protocol)
        if problems:
            raise PluginError(
                f"{variable}={spec!r} is not a usable {protocol.__name__.lower()}: {'; '.join(problems)} "
                f"(see {protocol.__module__}.{protocol.__qualname__})"
            )
    return plugin


def protocol_problems(plugin: object, protocol: type) -> list[str]:
    """What `plugin` lacks of what `protocol` declares, one short phrase each (empty: it conforms)."""
    hints = typing.get_type_hints(protocol)
    problems = []
    for name, hint in hints.items():
        if not hasattr(plugin, name):
            problems.append(f"it has no attribute {name}")
        elif isinstance(hint, type) and not isinstance(getattr(plugin, name), hint):
            problems.append(f"its {name} is {type(getattr(plugin, name)).__name__}, not {hint.__name__}")
    for name, declared in vars(protocol).items():
        if name.startswith("_") or not inspect.isfunction(declared):
            continue
        problem = _method_problem(plugin, name, declared)
        if problem:
            problems.append(problem)
    return problems


def _method_problem(plugin: object, name: str, declared: Any) -> str | None:
    method = getattr(plugin, name, None)
    if method is None:
        return f"it has no method {name}()"
    if not callable(method):
        return f"its {name} is not a method"
    wanted = len(inspect.signature(declared).parameters) - 1  # rem passes all but self, by position
    try:
        inspect.signature(method).bind(*range(wanted))
    except TypeError:
        return f"{name}() does not take the {wanted} argument(s) rem passes"
    except ValueError:  # no signature to read (a builtin): nothing to check
        return None
    if inspect.iscoroutinefunction(declared) and not inspect.iscoroutinefunction(method):
        return f"{name}() is not async"
    return None
