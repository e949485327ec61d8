"""Inference engines: the ``Engine`` protocol and the vLLM adapter."""
