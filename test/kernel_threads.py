"""Test helper: run one of the compiled kernel's functions on N torch threads, and nothing else."""
from __future__ import annotations

import torch


def kernel_on_threads(monkeypatch, ops, name: str, threads: int) -> list[int]:
    """Patch ``ops.<name>`` so that only that kernel call runs on ``threads`` torch threads; the
    returned list records each call. Torch's own ops around it (the root inference) stay on one
    thread: MKL's GEMM rounds differently on 3 threads than on 1 (a root value moved by an ulp),
    which would hide what the split itself does."""
    kernel, calls = getattr(ops, name), []

    def on_threads(*args, **kwargs):
        torch.set_num_threads(threads)
        try:
            calls.append(threads)
            return kernel(*args, **kwargs)
        finally:
            torch.set_num_threads(1)

    monkeypatch.setattr(ops, name, on_threads)
    return calls
