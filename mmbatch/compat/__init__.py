"""Small self-contained fixes for the environments mmbatch runs in."""
