"""Export for deployment: ONNX (fp32 or int8), with the preprocessing optionally inside the graph."""
