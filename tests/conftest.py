"""Shared test setup."""

import torch

# One thread per test process: the suite also starts subprocesses (DDP, multi-node), and oversubscribed
# cores make small-tensor work orders of magnitude slower than it is.
torch.set_num_threads(1)
