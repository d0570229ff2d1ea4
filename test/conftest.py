import os

# Ray (used only for multi-node runs) must stay on loopback in CI: without these, ray.init()
# binds the machine's interface address and probes a cloud metadata address at start.
# Set before anything imports ray.
from torchrl_muzero.trainers.ray_env import LOOPBACK_ENV  # noqa: E402 (a module that imports nothing)

for _k, _v in LOOPBACK_ENV.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402

torch.set_num_threads(1)
