import logging

from vitlab.export.checks import quiet_loggers


def test_quiet_loggers_restores_levels_and_takes_off_a_root_handler_a_library_added():
    """ONNX Runtime's static quantizer calls logging.basicConfig; the handler it leaves on the root logger would print
    every later vitlab message a second time, so `quiet_loggers` takes it off, and only it."""
    root = logging.getLogger()
    ours = logging.NullHandler()
    root.addHandler(ours)
    quantizer = logging.getLogger("onnxruntime.quantization")
    level = quantizer.level
    try:
        with quiet_loggers("onnxruntime.quantization"):
            assert quantizer.level == logging.ERROR
            added = logging.StreamHandler()
            root.addHandler(added)
        assert added not in root.handlers and ours in root.handlers
        assert quantizer.level == level
    finally:
        root.removeHandler(ours)
