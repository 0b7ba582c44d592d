"""The apps that ship with onceflow, declared the way any team declares its own (onceflow.app): each module holds
one `App`, registered as an `onceflow.apps` entry point in pyproject.toml. The platform never imports this package;
it finds the apps through the registry."""
