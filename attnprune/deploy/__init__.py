"""Deployment of (patched) models: int8."""

from .int8 import quantize_int8

__all__ = ["quantize_int8"]
