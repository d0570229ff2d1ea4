import pytest
import torch

# torch's own default (the machine's cores): what a user's training script runs with
DEFAULT_THREADS = torch.get_num_threads()

# kernels and buffers are measured on one thread: figures that do not depend on the machine's cores
torch.set_num_threads(1)


@pytest.fixture
def all_cores():
    """Run a pipeline benchmark as a user's script runs: torch on every core (then back to one)."""
    torch.set_num_threads(DEFAULT_THREADS)
    yield DEFAULT_THREADS
    torch.set_num_threads(1)
