"""Adapters to the tools users already run their data through (Hugging Face datasets)."""
