"""Where the platform finds the declared apps: installed packages' `onceflow.apps` entry points, and the settings'
app registry (ONCEFLOW_APP_REGISTRY: `name=package.module:attribute`, comma-separated) for a module that is not
packaged. A name found in both is the registry's (an operator can point an app at another module without
reinstalling)."""

from __future__ import annotations

import functools
import importlib
from importlib import metadata
from typing import Any

from onceflow.app.declaration import App, AppError

ENTRY_POINT_GROUP = "onceflow.apps"


def parse(registry: str) -> dict[str, str]:
    """`name=module:attribute, ...` -> {name: "module:attribute"}."""
    out: dict[str, str] = {}
    for item in (i.strip() for i in registry.split(",")):
        if not item:
            continue
        name, sep, target = (p.strip() for p in item.partition("="))
        if not sep or not name or ":" not in target:
            raise AppError(f"the app registry's entries are name=package.module:attribute; got {item!r}")
        out[name] = target
    return out


def declared(registry: str = "") -> dict[str, str]:
    """Every declared app's name and where its declaration is, the registry's over the entry points'."""
    points = {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return dict(sorted((points | parse(registry)).items()))


def load(where: str) -> Any:
    """The object `module:attribute` names (a declaration, or an app's reference check), imported."""
    module, _, attribute = where.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as e:
        raise AppError(str(e)) from e


@functools.lru_cache(maxsize=64)
def find(name: str, registry: str = "") -> App:
    """The declaration of app `name`, imported and checked."""
    where = declared(registry).get(name)
    if where is None:
        known = ", ".join(declared(registry)) or "none"
        raise AppError(
            f"no app named {name!r} is declared (declared: {known}): declare it with an `{ENTRY_POINT_GROUP}` "
            f"entry point of an installed package, or add {name}=package.module:attribute to "
            f"ONCEFLOW_APP_REGISTRY"
        )
    try:
        app = load(where)
    except AppError as e:
        raise AppError(f"app {name!r}: cannot load its declaration {where}: {e}") from e
    if not isinstance(app, App):
        raise AppError(f"app {name!r}: {where} is a {type(app).__name__}, not an onceflow.app.App")
    if app.name != name:
        raise AppError(f"app {name!r}: {where} declares an app named {app.name!r}")
    return app
