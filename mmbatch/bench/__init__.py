"""The throughput benchmark: naive vLLM against mmbatch, same model, images and sampling.

``mmbatch bench`` (see ``mmbatch/cli/bench.py``) builds the workloads once, then runs the
naive baseline and mmbatch each in a fresh subprocess (a whole GPU each, one engine start
each) over every workload, and writes one JSON report with the ratios.

The one-off checks (kills, memory, object storage, video decoding, invariance) are scripts
beside the package, in the repository's ``benchmarks/``.
"""
