"""Deployment of (patched) models: int8, ONNX export."""

from attnprune.deploy.int8 import quantize_int8
from attnprune.deploy.onnx import export_onnx

__all__ = ["export_onnx", "quantize_int8"]
