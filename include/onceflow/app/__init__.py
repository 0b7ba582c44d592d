"""Declared apps: what a team writes to put its stream on the platform (App, Results, Context), and where the
platform finds them (registry)."""

from onceflow.app.declaration import MAIN_OUTPUT, App, AppError, Context, Results

__all__ = ["MAIN_OUTPUT", "App", "AppError", "Context", "Results"]
