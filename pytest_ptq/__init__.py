"""pytest-ptq: find, fix and guard the accuracy lost by post-training quantization of ONNX models."""

__version__ = "0.1.0"
