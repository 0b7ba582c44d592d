"""A chaos run's log while it holds a broker down: librdkafka's "cannot reach the broker" errors of the run's own
clients are left out, every other line stays."""

import logging

from onceflow_dev import chaos


def test_unreachable_broker_errors_are_left_out_and_others_kept(caplog):
    log = logging.getLogger("onceflow.kafka.client.test")
    log.addFilter(chaos.BrokersDownByDesign())
    fmt = "%s [%s] %s"  # how confluent_kafka hands librdkafka's lines to a Python logger
    name = "rdkafka#consumer-328"
    with caplog.at_level(logging.INFO, logger=log.name):
        log.error(
            fmt, "FAIL", name, "[thrd:127.0.0.1:22759/3]: Connect to ipv4#127.0.0.1:22759 failed: Connection refused"
        )
        log.error(
            fmt, "FAIL", name, "[thrd:127.0.0.1:22759/3]: 127.0.0.1:22759/3: Disconnected (after 1203ms in state UP)"
        )
        log.error(fmt, "ERROR", name, "[thrd:app]: 3/3 brokers are down")
        log.error(
            fmt, "SASL", name, "[thrd:sasl_ssl://127.0.0.1:9093/1]: SASL authentication error: Authentication failed"
        )
        log.error(fmt, "TXNERR", name, "[thrd:main]: Current transaction failed in state InTransaction: fenced")
    kept = [r.getMessage() for r in caplog.records]
    assert len(kept) == 2 and "Authentication failed" in kept[0] and "fenced" in kept[1], kept


def test_prepare_var_puts_the_filter_on_the_clients_logger_once(tmp_path, monkeypatch):
    monkeypatch.setattr(chaos.config, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(chaos.logs, "setup", lambda *a, **k: None)  # the test session's logging stays
    client_log = logging.getLogger("onceflow.kafka.client")
    before = list(client_log.filters)
    try:
        chaos.prepare_var()
        chaos.prepare_var()
        assert sum(isinstance(f, chaos.BrokersDownByDesign) for f in client_log.filters) == 1
        assert (tmp_path / "var" / "chaos").is_dir()
    finally:
        client_log.filters[:] = before
