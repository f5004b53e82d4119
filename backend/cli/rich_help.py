"""typer's rich help and error panels without importing Markdown or tracebacks.

typer renders `--help` and usage errors with `typer.rich_utils`, which imports
`rich.markdown` (and with it markdown_it) and `rich.traceback` (pygments,
`rich.syntax`, `rich.pretty`) at its top: ~0.1 s of CPU, a third of what
`rem --help` cost, for two names rem never uses. rem's help is rich markup
(`rich_markup_mode="rich"`, typer's default), so `Markdown` is only built in
"markdown" mode, and `Traceback` only for typer's pretty exceptions, which rem
turns off (`pretty_exceptions_enable=False`).

`install()` (called once by `backend.cli.app`) puts a finder on
`sys.meta_path` that answers for `typer.rich_utils` only: while that module
runs its imports, `rich.markdown` and `rich.traceback` are stand-ins whose
`Markdown` and `Traceback` import the real class when first used, and they
leave `sys.modules` as soon as it has loaded, so anything else importing them
(the console's Markdown widget) gets the real modules. The panels, tables and
colours of the help are typer's own, unchanged. typer is pinned in
pyproject.toml; tests/cli/test_start_imports.py checks what `rem --help` loads
and that the stand-ins build the real classes.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from importlib.machinery import ModuleSpec, PathFinder
from typing import Any

TYPER_RICH_UTILS = "typer.rich_utils"


class DeferredMarkdown:
    """`rich.markdown.Markdown`, imported when one is first built."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from rich.markdown import Markdown  # import time: markdown_it, only if one is built

        return Markdown(*args, **kwargs)


class DeferredTraceback:
    """`rich.traceback.Traceback`, imported when one is first built."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from rich.traceback import Traceback  # import time: pygments, only if one is built

        return Traceback(*args, **kwargs)

    @classmethod
    def from_exception(cls, *args: Any, **kwargs: Any) -> Any:
        from rich.traceback import Traceback  # import time: pygments, only if one is built

        return Traceback.from_exception(*args, **kwargs)


def _stand_ins() -> dict[str, types.ModuleType]:
    markdown = types.ModuleType("rich.markdown", "rem's stand-in while typer.rich_utils loads")
    markdown.Markdown = DeferredMarkdown  # type: ignore[attr-defined]
    traceback = types.ModuleType("rich.traceback", "rem's stand-in while typer.rich_utils loads")
    traceback.Traceback = DeferredTraceback  # type: ignore[attr-defined]
    return {"rich.markdown": markdown, "rich.traceback": traceback}


class _LoaderWithoutMarkdown:
    """Runs typer.rich_utils' own loader with the stand-ins in `sys.modules`, then takes them out."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        added = {name: stub for name, stub in _stand_ins().items() if name not in sys.modules}
        sys.modules.update(added)
        try:
            self.loader.exec_module(module)
        finally:
            for name, stub in added.items():
                if sys.modules.get(name) is stub:
                    del sys.modules[name]


class RichUtilsFinder:
    """A `sys.meta_path` finder that only answers for typer.rich_utils."""

    @classmethod
    def find_spec(
        cls, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != TYPER_RICH_UTILS:
            return None
        spec = PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LoaderWithoutMarkdown(spec.loader)  # type: ignore[assignment]
        return spec


def install() -> None:
    """Load typer.rich_utils without Markdown or tracebacks from now on (idempotent)."""
    if RichUtilsFinder not in sys.meta_path and TYPER_RICH_UTILS not in sys.modules:
        sys.meta_path.insert(0, RichUtilsFinder)
