"""The one logging setup (onceflow.logs) and the CLI's quiet terminal on top of it."""

import logging

from onceflow import cli, config, logs


def test_one_handler_one_format_and_the_chatty_libraries_quiet(capsys):
    saved = logging.getLogger().handlers[:], logging.getLogger().level
    try:
        logs.setup("INFO")
        logs.setup("INFO")  # twice: still one handler, never doubled lines
        assert len(logging.getLogger().handlers) == 1
        logging.getLogger("onceflow.x").info("ours")
        logging.getLogger("py4j").info("gateway chatter")
        err = capsys.readouterr().err
        assert "INFO onceflow.x ours" in err and "chatter" not in err
        logs.setup("INFO", verbose=True)
        assert logging.getLogger("py4j").level == logging.DEBUG
    finally:
        logging.getLogger().handlers[:], _ = saved
        logging.getLogger().setLevel(saved[1])
        for name in logs.NOISY:
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_the_cli_terminal_gets_onceflows_lines_and_its_file_gets_every_line(tmp_path, capsys):
    saved = logging.getLogger().handlers[:], logging.getLogger().level
    try:
        cli.setup_logging(config.load(env={}, var_dir=tmp_path), verbose=False)
        logging.getLogger("onceflow.x").info("ours")
        logging.getLogger("some.library").info("theirs")
        err = capsys.readouterr().err
        assert "ours" in err and "theirs" not in err
        for h in logging.getLogger().handlers:
            h.flush()
        assert "theirs" in (tmp_path / "log" / "cli.log").read_text()
    finally:
        for h in logging.getLogger().handlers:
            if h not in saved[0]:
                h.close()
        logging.getLogger().handlers[:], _ = saved
        logging.getLogger().setLevel(saved[1])
