"""The runtimes that run a model: PyTorch on a checkpoint, and ONNX Runtime, OpenVINO and pt2e on the files
`vitlab export` writes. Each is a `Backend` (`vitlab.runtime.base`), one module each, and one row of the table in
`vitlab.runtime.registry`, which export, predict, eval, serve, info and bench all read."""
