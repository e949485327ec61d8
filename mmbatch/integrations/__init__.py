"""Adapters to the tools users already run their data through (Hugging Face datasets,
Ray Data); each imports its tool only inside the functions that use it."""
