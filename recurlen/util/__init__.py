"""The bottom layer: user errors, atomic file writes, fault-injection hooks, log lines above progress bars,
command-line argument parsing, TensorBoard helpers, tokenizers and hub resolution. Imports nothing above it."""
