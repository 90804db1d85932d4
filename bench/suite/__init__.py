"""The parts of bench/bench.py, the one GPU benchmark entry point (see its docstring):
timing (how a call is timed; PyTorch SDPA, the peers), library (libflashattn through the
flashattn Python package), sweeps (throughput, memory, block-sparse), verify (results
against the fp64 reference and the CPU backend), report (files, bench/results record,
table) and kernels (per-kernel GPU time)."""
