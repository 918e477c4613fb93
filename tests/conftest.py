"""Shared test configuration: float64 references and a fixed thread count."""

import torch

torch.set_num_threads(2)
