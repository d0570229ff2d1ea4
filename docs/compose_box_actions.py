"""Search your own model over a box action space with the shared MCTS loop.

The tree's edges are *slots* ``0..S-1``. Here every node of the model
proposes ``S`` candidate actions in ``[-1, 1]^2`` (kept in its state under
``"candidate_actions"``) and its policy logits are over those slots. The
model says how slots become env actions with ``slot_actions``, so its step
receives the chosen candidates, never slot ids; its step asks for the
search's generator to draw its candidates. ``MCTSPolicy`` then writes the
env action of the most visited root slot, and the root's candidates and
their visits. A ``GameBuffer`` told the env's action space stores the float
env actions themselves (and the candidates and visits as declared entries),
and samples them back as ``[B, K+1, 2]``. No library code is changed for any
of it.

    python docs/compose_box_actions.py          # a few seconds
"""
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import Bounded, Composite, Unbounded
from torchrl.envs import EnvBase

from torchrl_muzero.data import GameBuffer, ReplayEntry
from torchrl_muzero.envs.action_spaces import BoxActionSpace, action_space_of
from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
from torchrl_muzero.mcts.loop import CandidateActions, step_with_generator
from torchrl_muzero.modules import ModelStep

S = 6  # candidate actions per node: the search's slots


class ReachEnv(EnvBase):
    """A point in the plane steered by a 2-D action in [-1, 1]^2; the reward is minus its distance to 0."""

    def __init__(self, horizon: int = 8):
        super().__init__(batch_size=[])
        self.horizon, self.rng = horizon, torch.Generator()
        self.observation_spec = Composite(observation=Unbounded(shape=(2,)))
        self.action_spec = Bounded(-1.0, 1.0, shape=(2,))
        self.reward_spec = Unbounded(shape=(1,))

    def _reset(self, tensordict=None):
        self.pos, self.t = torch.rand(2, generator=self.rng) * 4 - 2, 0
        return TensorDict(observation=self.pos.clone(), done=torch.tensor([False]), terminated=torch.tensor([False]))

    def _step(self, tensordict):
        self.pos, self.t = self.pos + 0.5 * tensordict["action"], self.t + 1
        done = torch.tensor([self.t >= self.horizon])
        return TensorDict(observation=self.pos.clone(), reward=-self.pos.norm().view(1), done=done, terminated=done)

    def _set_seed(self, seed):
        self.rng.manual_seed(seed)


class CandidateModel(nn.Module):
    """A user's model: each node proposes S candidate actions, the policy is over them."""

    observation_shape = torch.Size([2])
    slot_actions = CandidateActions("candidate_actions")  # slot s of a node -> its candidate s
    action_space = BoxActionSpace(-1.0, 1.0, (2,))  # what it was built for: MCTSPolicy checks the env's against it

    def __init__(self, latent: int = 32):
        super().__init__()
        self.num_actions = S  # what the search sees: S slots
        self.represent = nn.Linear(2, latent)
        self.dynamics = nn.Linear(latent + 2, latent)
        self.heads = nn.Linear(latent, 2 + S)  # reward, value, logits over the slots
        self.propose = nn.Linear(latent, S * 2)

    def check_observation(self, observation):
        return observation.shape[:-1]

    def _node(self, latent, generator=None, spread=0.0):
        mean = self.propose(latent).view(-1, S, 2)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        candidates = torch.tanh(mean + spread * noise)  # inside the box's bounds
        reward, value, logits = self.heads(latent).split([1, 1, S], -1)
        state = TensorDict(latent=latent, candidate_actions=candidates, batch_size=latent.shape[:1])
        return ModelStep(state, reward.squeeze(-1), logits, value.squeeze(-1))

    def search_root(self, observation):
        return self._node(torch.tanh(self.represent(observation)), spread=1.0)

    @step_with_generator  # the loop passes the search's generator: expansions draw reproducibly
    def search_step(self, state, action, generator=None):
        # action [B, 2]: the env actions of the chosen slots (CandidateActions), not slot ids
        latent = torch.tanh(self.dynamics(torch.cat([state["latent"], action], -1)))
        return self._node(latent, generator, spread=0.3)


def main(frames: int = 32, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    env = ReachEnv()
    env.set_seed(seed)
    model = CandidateModel()
    policy = MCTSPolicy(model, MCTSConfig(num_simulations=12, discount=0.9), env.action_spec,
                        generator=torch.Generator().manual_seed(seed))
    collector = Collector(env, policy, frames_per_batch=frames, total_frames=frames,
                          auto_register_policy_transforms=False)
    entries = [ReplayEntry(("root", "candidates"), (S, 2)), ReplayEntry(("root", "candidate_visits"), (S,))]
    # told the box action space, the buffer stores the float actions the env took
    buffer = GameBuffer(1_000, num_unroll_steps=3, td_steps=3, discount=0.9, extra_entries=entries,
                        action_space=action_space_of(env), seed=seed)
    for batch in collector:
        buffer.extend(batch)
    collector.shutdown()

    sample = buffer.sample(16)
    taken = sample["action"]  # [16, 4, 2]: the env actions at the unrolled positions
    print(f"{frames} steps searched; a root's candidates and visits:")
    print(sample["root", "candidates"][0, 0], sample["root", "candidate_visits"][0, 0], sep="\n")
    return {"batch": batch, "sample": sample, "taken": taken}


if __name__ == "__main__":
    main()
