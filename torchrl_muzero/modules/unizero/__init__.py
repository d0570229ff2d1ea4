"""UniZero (arXiv 2406.10667): a transformer world model over ``[z_0, a_0, z_1, ...]``.

* :mod:`.norm` -- SimNorm / LayerNorm at the latent token;
* :mod:`.encoder` -- observation -> one latent token (MLP or ResNet);
* :mod:`.transformer` -- the causal GPT (absolute positions or RoPE) with a slot-addressed KV cache;
* :mod:`.model` -- :class:`UniZeroModel`: heads, training forward, search root/step with an exact cache.
"""
from torchrl_muzero.modules.unizero.norm import SimNorm, make_latent_norm
from torchrl_muzero.modules.unizero.encoder import MLPEncoder, ResNetEncoder
from torchrl_muzero.modules.unizero.transformer import CausalTransformer, RotaryEmbedding
from torchrl_muzero.modules.unizero.model import UniZeroModel

__all__ = ["CausalTransformer", "MLPEncoder", "ResNetEncoder", "RotaryEmbedding", "SimNorm", "UniZeroModel",
           "make_latent_norm"]
