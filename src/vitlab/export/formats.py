"""The names of the export formats, apart from the exporters so that `vitlab export --help` can list them without
importing torch."""

# --format's values; pt2 is another name for pt2e.
FORMATS = ("onnx", "pt2e", "pt2", "openvino")
