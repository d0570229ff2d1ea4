import os

# Ray (used only for multi-node runs) must stay on loopback in CI: without these, ray.init()
# binds the machine's interface address and probes a cloud metadata address at start.
# Set before anything imports ray.
for _k, _v in {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "no_proxy": "127.0.0.1,localhost",
    "NO_PROXY": "127.0.0.1,localhost",
    "GLOO_SOCKET_IFNAME": "lo",
    "RAY_AUTH_MODE": "disabled",
}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402

torch.set_num_threads(1)
