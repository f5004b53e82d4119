"""The console's seams: tui reaches rem only through backend.ops, and app.py only wires."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import backend
import tui

ROOT = Path(__file__).resolve().parents[2]


def test_the_console_contract_forbids_every_backend_package_but_ops() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [
        c for c in config["tool"]["importlinter"]["contracts"] if c.get("source_modules") == ["tui"]
    ]
    packages = {f"backend.{m.name}" for m in pkgutil.iter_modules(backend.__path__) if m.ispkg}
    # a new backend package is forbidden to the console until someone decides otherwise
    assert set(contract["forbidden_modules"]) == packages - {"backend.ops"}
    assert contract["type"] == "forbidden" and contract["allow_indirect_imports"] is True


def test_the_app_only_wires() -> None:
    app = Path(tui.__file__).with_name("app.py").read_text().splitlines()
    assert len(app) < 400, (
        f"tui/app.py has {len(app)} lines: move what is not wiring into a module of its own"
    )
