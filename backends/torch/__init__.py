"""The real-execution backend: a Llama-family decoder over a paged KV pool, timed per step.

Importing this package is cheap; the modules inside import torch. The registry reaches the
backend through `backends.torch.factory:make_torch`, so simulations that never ask for it
never import torch.
"""
