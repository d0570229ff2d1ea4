"""What the C++ fused UniZero search (``csrc/unizero_net.h``) needs from a :class:`UniZeroModel`.

The fused search runs every simulation of a CPU search in one C++ call: the
root is still encoded in torch (:meth:`UniZeroModel.search_root`), every
expansion (action token and predicted latent token through the transformer,
the four heads, the decode) runs in the kernel, with the exact per-node KV
cache (``kv_cache=True``) or a full recompute of the node's context
(``kv_cache=False``): the same two modes as the torch model, in one engine.
:func:`fused_root` is the root's window forward in the same kernel (the
encoder stays in torch).

:func:`fused_unizero_weights` says whether a model is one the kernel mirrors
and returns its tensors; anything else (``on_overflow="error"``, a head
dimension that is not a multiple of 8, another dtype or device, a subclass
that overrides the step, a changed head or block structure) gets ``None``,
and the search calls :meth:`UniZeroModel.search_step` per simulation.
:func:`fused_search_step` is the kernel's step on a batch of node states (the
test hook; a search never needs it).

:func:`use_kernel` switches the kernel off for the code it wraps: a search
with ``MCTSConfig(backend="torch")`` builds its root inside ``use_kernel(False)``,
so the root's window forward runs in torch too and nothing of that search
reaches the kernel (the model itself knows nothing of search configs).
"""
from __future__ import annotations

import contextlib
import contextvars
import operator
import weakref
from itertools import chain
from typing import Iterator

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from torchrl_muzero.modules.fused_spec import StateLeaf
from torchrl_muzero.modules.step import ModelStep
from torchrl_muzero.modules.unizero.norm import SimNorm

__all__ = ["fused_unizero_weights", "fused_root", "fused_root_from_leaves", "fused_root_window", "fused_search_step",
           "kernel_enabled", "use_kernel", "UZ_NODE_STATE", "UZ_STATE_KEYS"]

#: The node-state keys of a UniZero tree in the cache mode (the recompute mode has no ``"kv"``).
UZ_STATE_KEYS = ("latents", "actions", "length", "kv")
#: That node state as the fused ``"unizero"`` entry reads it (:meth:`UniZeroModel.fused_kernel_spec`).
UZ_NODE_STATE = tuple(StateLeaf(key, dtype) for key, dtype in zip(
    UZ_STATE_KEYS, (torch.float32, torch.int64, torch.int64, torch.float32)))

_EMPTY = torch.empty(0)
# model -> (weak refs to its modules, their members' ids, its tensors, storage key, fused tensors): collecting
# costs as much as a small search (validity: _still_valid; figure: docs/performance_search.md,
# "Design figures quoted from the code").
_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _is_head(head: nn.Module) -> bool:
    return (
        type(head) is nn.Sequential and len(head) == 3 and type(head[0]) is nn.Linear
        and type(head[1]) is nn.GELU and head[1].approximate == "none" and type(head[2]) is nn.Linear
    )


def _is_affine_ln(ln: nn.Module, dim: int) -> bool:
    return (
        type(ln) is nn.LayerNorm and tuple(ln.normalized_shape) == (dim,)
        and ln.weight is not None and ln.bias is not None
    )


def fused_unizero_weights(model) -> tuple[list[torch.Tensor], list[int], list[float]] | None:
    """``(tensors, ints, floats)`` for the kernel's ``unizero_search``, or ``None`` when it cannot run ``model``.

    ``ints``: num_layers, num_heads, max_blocks, context_length, SimNorm
    group (0: LayerNorm latent norm), num_actions, absolute positions (0:
    RoPE). ``floats``: the transformer's LayerNorm eps, the latent norm's eps,
    the reward and value support epsilons. ``tensors``: in the order of
    ``pack_unizero`` (``csrc/unizero_net.cpp``).

    Examples:
        >>> from torchrl_muzero.modules.unizero import UniZeroModel
        >>> from torchrl_muzero.modules.unizero.fused import fused_unizero_weights
        >>> model = UniZeroModel((4,), 2, embed_dim=16, num_heads=2, context_length=2, max_blocks=5)
        >>> tensors, ints, floats = fused_unizero_weights(model)
        >>> len(tensors), ints
        (50, [2, 2, 5, 2, 8, 2, 0])
        >>> fused_unizero_weights(UniZeroModel((4,), 2, embed_dim=16, num_heads=4)) is None  # head_dim 4
        True
    """
    # the class the kernel mirrors (UniZeroModel: the class that defines fused_unizero_weights), found in the
    # model's MRO: model.py imports this module, so this module cannot import model.py back
    UniZeroModel = next((c for c in type(model).__mro__ if "fused_unizero_weights" in vars(c)), None)
    if UniZeroModel is None or not isinstance(model, UniZeroModel):
        return None
    hit = _CACHE.get(model)
    if hit is not None and _still_valid(model, hit):
        return hit[5]
    modules = _walk(model)
    members = _members(modules)
    collected = _collect(model, UniZeroModel)
    out, copied = collected if collected is not None else (None, ())
    tensors = [t for t in members if isinstance(t, torch.Tensor)]
    _CACHE[model] = ([weakref.ref(m) for m in modules], tuple(map(id, members)), tensors, copied,
                     _key(model, tensors, copied), out)
    return out


# A cache entry is valid while the model's modules hold the same parameter, buffer and submodule
# objects over the same storages and `on_overflow` is unchanged (in-place updates keep all of
# that; .to(), .double(), a replaced module or a new parameter do not): the tensors returned are
# views of the live storages, and the kernel repacks on its own when their values change. A
# source that is not a contiguous float32 tensor (a transposed view, a parameter loaded with
# load_state_dict(assign=True) from such a checkpoint tensor) is handed over as a copy, which an
# in-place update of the source does not reach: the entry also keys on those sources' version
# counters (a view shares its base's), so such an update re-collects. In-place writes that skip
# the version counter (through `.data`, or shared memory written by another process) are seen
# for views only, as before. The common case (every source a view) adds no check. The
# check runs twice per search (root and search), so it avoids a Python loop over the modules'
# dicts, several times slower (docs/performance_search.md, "Design figures quoted from the
# code"). The entry holds the modules through weak references
# (a strong one would keep the model alive: model.sequence refers back to it) and their members
# by id (the parameters and buffers also as tensors, which refer to no module): a cached module
# cannot be freed and its id reused without its weak reference dying, and a cached tensor cannot.
_DICTS = operator.attrgetter("_parameters", "_buffers", "_modules")


def _walk(model: nn.Module) -> list[nn.Module]:
    modules, stack = [], [model]
    while stack:
        module = stack.pop()
        modules.append(module)
        stack += [m for m in module._modules.values() if m is not None]
    return modules


def _members(modules: list[nn.Module]) -> tuple:
    """Every value of every module's parameter, buffer and submodule dicts, in one C-level pass."""
    return tuple(chain.from_iterable(map(dict.values, chain.from_iterable(map(_DICTS, modules)))))


_VERSION = operator.attrgetter("_version")


def _key(model, tensors: list[torch.Tensor], copied: tuple) -> tuple:
    key = (model.on_overflow, *map(torch.Tensor.data_ptr, tensors))
    return key + tuple(map(_VERSION, copied)) if copied else key


def _still_valid(model, hit: tuple) -> bool:
    refs, ids, tensors, copied, key, _ = hit
    try:
        members = _members([ref() for ref in refs])
    except AttributeError:  # a cached module was freed (its weak reference gives None): the model changed
        return False
    # The same objects in every dict of the cached modules (the first is the model): the modules
    # reachable from the model are the cached ones, holding the same parameters and buffers.
    return tuple(map(id, members)) == ids and _key(model, tensors, copied) == key


def _collect(model, UniZeroModel) -> tuple[tuple[list[torch.Tensor], list[int], list[float]], tuple] | None:
    """``(fused, copied)``: :func:`fused_unizero_weights`'s answer and the source tensors that ``fused``
    holds copies of, not views (``_key``); ``None`` when the kernel cannot run this model."""
    cls = type(model)
    # A subclass that changes any part of the step is not the model the kernel mirrors.
    for name in ("search_step", "_action_heads", "_latent_heads", "_tokens", "_slide", "_decode"):
        if getattr(cls, name) is not getattr(UniZeroModel, name):
            return None
    if getattr(model, "action_dim", None) is not None:  # the kernel looks actions up in the embedding table
        return None
    gpt, E = model.transformer, model.embed_dim
    ref = gpt.ln_f.weight
    if model.on_overflow != "rebuild" or ref.dtype != torch.float32 or ref.device.type != "cpu":
        return None
    if gpt.head_dim % 8 or not _is_affine_ln(gpt.ln_f, E):
        return None
    heads = (model.latent_head, model.reward_head, model.policy_head, model.value_head)
    if not all(_is_head(h) for h in heads):
        return None
    eps = {gpt.ln_f.eps}
    tensors = [model.action_embedding.weight]
    if gpt.position == "absolute":
        tensors += [gpt.pos_emb.weight, _EMPTY, _EMPTY]
    else:
        tensors += [_EMPTY, gpt.rope.cos, gpt.rope.sin]
    for block in gpt.blocks:
        mlp = block.mlp
        if not (
            _is_affine_ln(block.ln1, E) and _is_affine_ln(block.ln2, E) and type(mlp) is nn.Sequential
            and len(mlp) == 3 and type(mlp[1]) is nn.GELU and mlp[1].approximate == "none"
            and block.attn.qkv.bias is not None and block.attn.proj.bias is not None
        ):
            return None
        eps |= {block.ln1.eps, block.ln2.eps}
        tensors += [block.ln1.weight, block.ln1.bias, block.attn.qkv.weight, block.attn.qkv.bias,
                    block.attn.proj.weight, block.attn.proj.bias, block.ln2.weight, block.ln2.bias,
                    mlp[0].weight, mlp[0].bias, mlp[2].weight, mlp[2].bias]
    if len(eps) != 1:  # the kernel takes one eps for the transformer's LayerNorms
        return None
    tensors += [gpt.ln_f.weight, gpt.ln_f.bias]
    for head in heads:
        if head[0].bias is None or head[2].bias is None:
            return None
        tensors += [head[0].weight, head[0].bias, head[2].weight, head[2].bias]
    norm = model.latent_norm
    if type(norm) is SimNorm:
        simnorm, norm_eps = norm.simnorm_dim, 0.0
        tensors += [_EMPTY, _EMPTY]
    elif _is_affine_ln(norm, E):
        simnorm, norm_eps = 0, norm.eps
        tensors += [norm.weight, norm.bias]
    else:
        return None
    tensors += [model.reward_support.bins, model.value_support.bins]
    fused = [t.detach().float().contiguous() for t in tensors]
    # .float() and .contiguous() return a contiguous float32 tensor itself (a view of the live storage);
    # every other source is copied, and only its version counter tells of an in-place update
    copied = tuple(t for t in tensors if t.dtype != torch.float32 or not t.is_contiguous())
    ints = [len(gpt.blocks), gpt.num_heads, model.max_blocks, model.context_length, simnorm,
            model.num_actions, int(gpt.position == "absolute")]
    floats = [float(eps.pop()), float(norm_eps), model.reward_support.epsilon, model.value_support.epsilon]
    return (fused, ints, floats), copied


# Whether the code running now may call the kernel (use_kernel). A context variable, not a module
# flag: a search in one thread (or asyncio task) switching it off leaves the others' searches alone.
_KERNEL_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("torchrl_muzero_unizero_kernel", default=True)


@contextlib.contextmanager
def use_kernel(enabled: bool) -> Iterator[None]:
    """Within the block, the UniZero model calls the C++ kernel only if ``enabled`` (outside: always may).

    With ``enabled=False`` :meth:`~torchrl_muzero.modules.unizero.UniZeroModel.search_root`,
    ``root_from_latents`` and ``root_value`` run their window forward in torch
    (:func:`fused_root` and :func:`fused_root_window` give ``None``). The
    searches enter it for ``MCTSConfig(backend="torch")``
    (:func:`~torchrl_muzero.mcts.search.backend_scope`). Nests; per thread.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.unizero import UniZeroModel
        >>> from torchrl_muzero.modules.unizero.fused import kernel_enabled, use_kernel
        >>> model = UniZeroModel((4,), 2, embed_dim=16, num_heads=2, context_length=2, max_blocks=5)
        >>> with use_kernel(False):
        ...     root = model.search_root(torch.randn(3, 3, 4), torch.randint(2, (3, 2)))  # torch only
        ...     kernel_enabled()
        False
        >>> kernel_enabled()
        True
    """
    token = _KERNEL_ON.set(bool(enabled))
    try:
        yield
    finally:
        _KERNEL_ON.reset(token)


def kernel_enabled() -> bool:
    """Whether the code running now may call the C++ kernel (:func:`use_kernel`)."""
    return _KERNEL_ON.get()


def _kernel(name: str):
    from torchrl_muzero.kernel import load_tree_ops

    ops = load_tree_ops()
    return None if ops is None else getattr(ops, name, None)


def fused_root(model, state: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The root's ``(policy_logits, value)`` from its packed node state in one C++ call, or ``None``.

    Used by :meth:`UniZeroModel.root_from_latents` when the kernel runs the
    model: the window's full forward, its K/V (written into ``state["kv"]``,
    which must be zeros, when the model caches) and the heads at the last
    latent, without the per-op dispatch of the torch forward (figure:
    docs/performance_search.md, "Design figures quoted from the code"). The
    encoder stays in torch.
    """
    kv = state["kv"] if model.kv_cache else None
    return fused_root_from_leaves(model, state["latents"], state["actions"], state["length"], kv)


def fused_root_from_leaves(
    model, latents: torch.Tensor, actions: torch.Tensor, length: torch.Tensor, kv: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`fused_root` on the state's leaves (``kv`` ``None`` without the cache), as
    :meth:`UniZeroModel.root_from_latents` holds them: no TensorDict reads (their cost per search:
    docs/performance_search.md, "Design figures quoted from the code")."""
    if not _KERNEL_ON.get():  # inside use_kernel(False): the caller takes its torch path
        return None
    kernel = _kernel("unizero_root")
    if kernel is None or latents.device.type != "cpu" or latents.dtype != torch.float32:
        return None
    fused = fused_unizero_weights(model)
    if fused is None:
        return None
    logits, value = kernel(*fused, latents.contiguous(), actions.contiguous(), length.contiguous(), kv, False)
    return logits, value


def fused_root_window(
    model, latents: torch.Tensor, actions: torch.Tensor, keep_cache: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor] | None:
    """:meth:`UniZeroModel.root_from_latents` for full windows in one C++ call, or ``None``.

    Every row of ``latents [B, K + 1, E]`` and ``actions [B, K]`` is a real
    step (no ``valid`` mask: the packing is the identity), so the kernel makes
    the node state's leaves itself (``latents``, ``actions``, ``length``,
    ``kv`` or ``None``) and runs :func:`fused_root`'s forward: ~8 torch ops
    fewer per search. Returns those four, then ``policy_logits`` and ``value``.
    ``keep_cache`` (default: the model's ``kv_cache``) False leaves the keys /
    values out (``kv`` ``None``; the value and logits are the same).
    """
    if not _KERNEL_ON.get():  # inside use_kernel(False): the caller takes its torch path
        return None
    kernel = _kernel("unizero_root_window")
    if kernel is None or latents.device.type != "cpu" or latents.dtype != torch.float32:
        return None
    fused = fused_unizero_weights(model)
    if fused is None:
        return None
    cache = model.kv_cache if keep_cache is None else keep_cache
    state_latents, state_actions, length, kv, logits, value = kernel(*fused, latents, actions, cache)
    return state_latents, state_actions, length, kv if cache else None, logits, value


def fused_search_step(model, state: TensorDictBase, action: torch.Tensor, baseline: bool = False,
                      fma: bool = False) -> ModelStep:
    """The C++ kernel's :meth:`UniZeroModel.search_step` on a batch of node states (the test hook).

    The cache mode when ``model.kv_cache`` (``state`` holds ``"kv"``), else
    the recompute mode. ``baseline`` forces the kernel's 4-wide build,
    ``fma`` its FMA copy (where the CPU has AVX2 + FMA; ``kernel_precision``).
    Raises ``RuntimeError`` if the kernel or this model is not supported.
    """
    fused = fused_unizero_weights(model)
    if fused is None:
        raise RuntimeError(f"the fused UniZero step does not support this model: {model!r}")
    kernel = _kernel("unizero_recurrent")
    if kernel is None:
        raise RuntimeError("the C++ tree kernel (with unizero_recurrent) is unavailable")
    kv = state["kv"].contiguous() if model.kv_cache else None
    latents, actions, length, kv, reward, logits, value, _ = kernel(
        *fused, state["latents"].contiguous(), state["actions"].contiguous(),
        state["length"].contiguous(), kv, action.long().contiguous(), baseline, **({"fma": True} if fma else {}),
    )
    child = TensorDict({"latents": latents, "actions": actions, "length": length}, [length.shape[0]])
    if model.kv_cache:
        child["kv"] = kv
    return ModelStep(child, reward, logits, value)
