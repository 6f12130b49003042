"""vitlab.messages: what the library tells its user goes through the "vitlab" logger, shown on stdout or stderr as
print showed it, and a Python user can silence or capture it."""

import logging

from vitlab import messages


def test_a_message_is_shown_as_it_is_on_stdout_or_stderr(capsys):
    messages.say("note: 100% of it, as is")
    messages.say("bench: preparing eager-fp32 ...", to_stderr=True)
    captured = capsys.readouterr()
    assert captured.out == "note: 100% of it, as is\n" and captured.err == "bench: preparing eager-fp32 ...\n"


def test_a_user_can_silence_or_capture_them(capsys, caplog):
    logger = logging.getLogger("vitlab")
    logger.setLevel(logging.WARNING)
    try:
        messages.say("not shown")
    finally:
        logger.setLevel(logging.INFO)
    assert capsys.readouterr().out == ""
    logger.removeHandler(messages.CONSOLE)
    try:
        with caplog.at_level(logging.INFO, logger="vitlab"):
            messages.say("captured, not printed")
    finally:
        logger.addHandler(messages.CONSOLE)
    assert capsys.readouterr().out == "" and caplog.messages == ["captured, not printed"]


def test_an_error_logged_under_vitlab_keeps_its_traceback_on_stderr(capsys):
    try:
        raise ValueError("broken")
    except ValueError:
        logging.getLogger("vitlab.serve").exception("error while answering %s", "/v1/predict")
    err = capsys.readouterr().err
    assert err.startswith("error while answering /v1/predict\nTraceback") and "ValueError: broken" in err


def test_counts_take_the_number_of_their_noun():
    assert messages.counted(1, "unreadable file") == "1 unreadable file"
    assert messages.counted(0, "pair") == "0 pairs" and messages.counted(3, "process", "processes") == "3 processes"
    assert messages.unreadable_line(["a.jpg: broken"]) == "1 unreadable file left out: a.jpg: broken"
    assert messages.unreadable_line(["a.jpg: x", "b.jpg: y"]) == "2 unreadable files left out: a.jpg: x, ..."


def test_quiet_loggers_restores_levels_and_takes_off_a_root_handler_a_library_added():
    """ONNX Runtime's static quantizer calls logging.basicConfig; the handler it leaves on the root logger would print
    every later vitlab message a second time, so `quiet_loggers` takes it off, and only it."""
    root = logging.getLogger()
    ours = logging.NullHandler()
    root.addHandler(ours)
    quantizer = logging.getLogger("onnxruntime.quantization")
    level = quantizer.level
    try:
        with messages.quiet_loggers("onnxruntime.quantization"):
            assert quantizer.level == logging.ERROR
            added = logging.StreamHandler()
            root.addHandler(added)
        assert added not in root.handlers and ours in root.handlers
        assert quantizer.level == level
    finally:
        root.removeHandler(ours)
