"""One error model: every exception the platform defines derives from onceflow.wire.OnceflowError, so a caller
can tell the platform's own refusals (each says what to change) from a library's failure."""

import importlib
import inspect
import pkgutil

import onceflow
import onceflow_dev
from onceflow.wire import OnceflowError


def _modules(package):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        yield importlib.import_module(info.name)


def test_every_exception_the_platform_defines_is_an_onceflow_error():
    strays, seen = [], 0
    for package in (onceflow, onceflow_dev):
        for module in _modules(package):
            for name, obj in vars(module).items():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                    seen += 1
                    if not issubclass(obj, OnceflowError):
                        strays.append(f"{module.__name__}.{name}")
    assert seen >= 40, seen  # the walk found the platform's errors
    assert not strays, strays


def test_the_sink_raises_the_writers_errors_as_they_are():
    """One hierarchy for a transaction's outcome (onceflow.kafka.transactional): the sink defines no error of its
    own for fencing, the coordinator's timeout or a refused configuration, and the driver's exit codes are told
    from the writer's classes."""
    from onceflow.kafka import transactional as tw
    from onceflow.protocol import exactly_once

    own = {n for n, o in vars(exactly_once).items() if inspect.isclass(o) and issubclass(o, BaseException)}
    own = {n for n in own if getattr(exactly_once, n).__module__ == exactly_once.__name__}
    assert own == {"BatchNotCommitted", "UndeliverableRecord"}, own
    assert all(issubclass(c, tw.TxnError) for c in (tw.Fenced, tw.CoordinatorTimedOut, tw.TxnConfigError))
