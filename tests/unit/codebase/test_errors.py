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
    from onceflow.protocol import batch_sink, exactly_once

    def own(module):
        found = {n for n, o in vars(module).items() if inspect.isclass(o) and issubclass(o, BaseException)}
        return {n for n in found if getattr(module, n).__module__ == module.__name__}

    assert own(exactly_once) == set(), own(exactly_once)
    assert own(batch_sink) == {"BatchNotCommitted", "UndeliverableRecord", "UnknownOutput"}, own(batch_sink)
    assert all(issubclass(c, tw.TxnError) for c in (tw.Fenced, tw.CoordinatorTimedOut, tw.TxnConfigError))


def test_fencing_is_one_fact_whatever_the_sink():
    """A driver fenced by a newer one stops for good, whether its sink is Kafka or a database: both sinks' fencing
    errors are wire.Fenced, which the driver's exit codes are told from."""
    from onceflow import wire
    from onceflow.kafka import transactional as tw
    from onceflow.protocol import database_sink
    from onceflow.runtime.driver_state import failure_exit_code, startup_exit_code

    for err in (tw.Fenced("x"), database_sink.Fenced("x")):
        assert isinstance(err, wire.Fenced)
        assert failure_exit_code(err) == startup_exit_code(err) == wire.EXIT_FENCED
