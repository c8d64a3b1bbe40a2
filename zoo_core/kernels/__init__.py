"""Kernel ops: SSM convolution kernels, causal convolutions and linear-recurrence scans.

Each fast op has a ``*_naive`` twin with the same signature in the same module; tests compare
outputs and gradients of the two.
"""
