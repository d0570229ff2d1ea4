"""Store stacked observations one frame at a time.

torchrl's :class:`~torchrl.envs.CatFrames` turns a stream of frames into
stacks of the ``N`` most recent ones, oldest first, concatenated along a
(negative) dimension. At a reset it pads the stack: with ``padding="same"``
every slot holds the first frame, with ``padding="constant"`` the ``N - 1``
older slots hold ``padding_value``. Consecutive stacks share ``N - 1`` frames,
so a replay buffer that stores stacks stores every frame ``N`` times.

:class:`FrameStack` is the small piece of arithmetic that lets the
:class:`~torchrl_muzero.data.GameBuffer` keep only the newest frame of each
observation and rebuild the stack at sample time, bit-identical to what
``CatFrames`` produced.
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["FrameStack"]

_PADDINGS = ("same", "constant")


class FrameStack:
    """Split CatFrames stacks into frames and rebuild them.

    Args:
        num_frames (int): ``N``, the number of stacked frames (the ``N`` of
            ``CatFrames``). 1 means no stacking: the frame is the observation.
        dim (int): the negative dimension the frames are concatenated along
            (the ``dim`` of ``CatFrames``), relative to one observation.
            Defaults to ``-3`` (channels of a ``[C, H, W]`` image).
        padding (str): ``"same"`` or ``"constant"``, as in ``CatFrames``.
        padding_value (float): the value of constant padding.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data import FrameStack
        >>> stack = FrameStack(num_frames=4, dim=-3)
        >>> frames = torch.arange(5, dtype=torch.uint8).view(5, 1, 1, 1).expand(5, 1, 2, 2)
        >>> stack.frame_shape((4, 2, 2))
        torch.Size([1, 2, 2])
        >>> # the history of an observation, oldest first; index 0 repeats at the
        >>> # start of the episode (CatFrames' "same" padding)
        >>> obs = stack.rebuild(frames[torch.tensor([[0, 0, 1, 2]])])
        >>> obs.shape, obs[0, :, 0, 0].tolist()
        (torch.Size([1, 4, 2, 2]), [0, 0, 1, 2])
        >>> stack.newest(obs)[0, :, 0, 0].tolist()
        [2]
    """

    def __init__(self, num_frames: int = 1, dim: int = -3, padding: str = "same", padding_value: float = 0) -> None:
        if not isinstance(num_frames, int) or num_frames < 1:
            raise ValueError(f"frame_stack (num_frames) must be an integer >= 1, got {num_frames!r}.")
        if not isinstance(dim, int) or dim >= 0:
            raise ValueError(
                f"the frame-stack dim must be a negative integer (as CatFrames' dim), got {dim!r}."
            )
        if padding not in _PADDINGS:
            raise ValueError(f"frame padding must be one of {_PADDINGS}, got {padding!r}.")
        self.num_frames = num_frames
        self.dim = dim
        self.padding = padding
        self.padding_value = padding_value

    # -- shapes ---------------------------------------------------------------
    def frame_shape(self, observation_shape: Sequence[int]) -> torch.Size:
        """The shape of one stored frame for observations of ``observation_shape``."""
        shape = list(observation_shape)
        if self.num_frames == 1:
            return torch.Size(shape)
        if len(shape) < -self.dim:
            raise ValueError(
                f"observations of shape {tuple(shape)} have no dimension {self.dim} to unstack "
                f"{self.num_frames} frames from."
            )
        size = shape[self.dim]
        if size % self.num_frames:
            raise ValueError(
                f"observation dimension {self.dim} has size {size}, not a multiple of "
                f"frame_stack={self.num_frames}: is the observation stacked by CatFrames(N={self.num_frames}, "
                f"dim={self.dim})?"
            )
        shape[self.dim] = size // self.num_frames
        return torch.Size(shape)

    # -- split ----------------------------------------------------------------
    def newest(self, observation: torch.Tensor) -> torch.Tensor:
        """The newest frame of each stacked observation (a view)."""
        if self.num_frames == 1:
            return observation
        size = observation.shape[self.dim] // self.num_frames
        return observation.narrow(self.dim, (self.num_frames - 1) * size, size)

    def is_padded_start(self, observation: torch.Tensor) -> torch.Tensor:
        """Whether each stack ``[M, *obs_shape]`` is what CatFrames builds at a reset.

        True when the older slots hold the padding of the newest frame: the
        first observation of an episode. Always True without stacking.
        """
        m = observation.shape[0]
        if self.num_frames == 1:
            return torch.ones(m, dtype=torch.bool, device=observation.device)
        newest = self.newest(observation)
        if self.padding == "same":
            expected = torch.cat([newest] * self.num_frames, dim=self.dim)
        else:
            pad = torch.full_like(newest, self.padding_value)
            expected = torch.cat([pad] * (self.num_frames - 1) + [newest], dim=self.dim)
        return (observation == expected).flatten(1).all(1)

    # -- rebuild --------------------------------------------------------------
    def rebuild(self, frames: torch.Tensor, padded: torch.Tensor | None = None) -> torch.Tensor:
        """Concatenate histories ``[M, N, *frame_shape]`` (oldest first) into stacks.

        ``padded`` (``[M, N]`` bool, optional) marks the slots before the start
        of the episode. With ``"same"`` padding the caller passes the episode's
        first frame there (nothing to do); with ``"constant"`` padding those
        slots are overwritten with ``padding_value``.
        """
        if frames.shape[1] != self.num_frames:
            raise ValueError(f"expected {self.num_frames} frames per history, got shape {tuple(frames.shape)}.")
        if self.num_frames == 1:
            return frames[:, 0]
        if self.padding == "constant" and padded is not None and bool(padded.any()):
            frames = frames.clone()
            frames[padded] = torch.as_tensor(self.padding_value, dtype=frames.dtype)
        frame_ndim = frames.ndim - 2
        axis = frame_ndim + self.dim  # position of the stacked dim inside a frame
        # [M, N, *pre, d, *post] -> [M, *pre, N, d, *post] -> [M, *pre, N * d, *post]
        moved = frames.movedim(1, 1 + axis)
        shape = list(frames.shape[2:])
        shape[axis] *= self.num_frames
        return moved.reshape(frames.shape[0], *shape)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_frames={self.num_frames}, dim={self.dim}, "
            f"padding={self.padding!r}, padding_value={self.padding_value})"
        )
