"""UniZero's acting memory: the window of the last raw observations and actions per env."""
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector

from torchrl_muzero.envs import make_env
from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
from torchrl_muzero.mcts.acting_memory import with_acting_memory
from torchrl_muzero.mcts.history_memory import HistoryWindowMemory
from torchrl_muzero.modules.unizero import UniZeroModel
from torchrl_muzero.trainers.config import EnvConfig

CONFIG = MCTSConfig(num_simulations=4, backend="torch")
L = 3


def _model():
    torch.manual_seed(0)
    return UniZeroModel((4,), 2, embed_dim=16, num_heads=2, context_length=L, max_blocks=L + 4,
                        value_support_size=5, reward_support_size=5, encoder_hidden_dim=16).eval()


def _policy(model):
    return MCTSPolicy(model, CONFIG, generator=torch.Generator().manual_seed(0), memory=HistoryWindowMemory(L))


def test_after_a_reset_the_window_is_empty_and_the_root_is_the_observation_alone():
    model = _model()
    memory = HistoryWindowMemory(L).bind(model)
    fresh = memory.zeros(3)
    assert (fresh["history_count"] == 0).all() and (fresh["history_observation"] == 0).all()
    obs = torch.randn(3, 4)
    root, alone = memory.root(model, obs, fresh), model.search_root(obs)
    torch.testing.assert_close(root.policy_logits, alone.policy_logits)
    torch.testing.assert_close(root.value, alone.value)
    assert torch.equal(root.state["length"], alone.state["length"])


def test_the_window_holds_exactly_the_last_steps_of_each_episode():
    policy = _policy(_model())
    env = with_acting_memory(make_env(EnvConfig(), num_envs=2, seed=0), policy)
    collector = Collector(env, policy, frames_per_batch=120, total_frames=120, auto_register_policy_transforms=False)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    done = batch["next", "done"].squeeze(-1)
    assert done.any(), "no episode ended: the reset path was not exercised"
    checked_full = 0
    for env_i in range(batch.shape[0]):
        start = 0  # index of the episode's first step in this rollout
        for i in range(batch.shape[1]):
            row = batch[env_i, i]
            n = min(i - start, L)
            assert int(row["history_count"]) == n
            if n:
                past = batch[env_i, i - n:i]
                assert torch.equal(row["history_observation"][L - n:], past["observation"])
                assert torch.equal(row["history_action"][L - n:], past["action"].reshape(n).long())
                checked_full += n == L
            if bool(done[env_i, i]):
                start = i + 1
    assert checked_full > 20


def test_the_search_never_writes_the_memory():
    model = _model()
    policy = _policy(model)
    B = 3
    memory = TensorDict({"history_observation": torch.randn(B, L, 4), "history_action": torch.randint(2, (B, L)),
                         "history_count": torch.tensor([0, 2, 3])}, [B])
    td = TensorDict({"observation": torch.randn(B, 4)}, [B]).update(memory.clone())
    out = policy(td)
    for key in memory.keys():
        assert torch.equal(out[key], memory[key])
    assert torch.equal(out["next", "history_count"], torch.tensor([1, 3, 3]))
    assert torch.equal(out["next", "history_observation"][:, -1], td["observation"])
    assert torch.equal(out["next", "history_action"][:, -1], out["action"].reshape(B).long())
    # the root this memory gives is the model's search root over the window
    window = torch.cat([memory["history_observation"], td["observation"][:, None]], 1)
    valid = torch.arange(L + 1)[None] >= (L - memory["history_count"])[:, None]
    expected = model.search_root(window, memory["history_action"], valid)
    got = policy.memory.root(model, td["observation"], memory)
    torch.testing.assert_close(got.policy_logits, expected.policy_logits)


def test_after_new_weights_mid_episode_the_next_search_is_the_new_networks_alone():
    """The KV-cache lifecycle rule of the issue ("a cache never outlives the weights that made it"), held by
    construction: the memory keeps only raw observations, actions and a count (no latent, no keys/values) and
    no search state lives on the model between calls. So after a publish in the middle of an episode the next
    search equals a freshly built policy's with the new weights on the same rollout entries, and differs from
    the old weights' search. Storing a latent or a KV cache in the memory, or on the module, fails this."""
    old, new = _model(), _model()
    torch.manual_seed(1)
    new.load_state_dict({k: v + 0.05 * torch.randn_like(v) for k, v in new.state_dict().items()})
    policy = _policy(old)
    env = with_acting_memory(make_env(EnvConfig(), num_envs=2, seed=0), policy)
    td = env.reset()
    for _ in range(L + 1):  # a full window, built with the old weights acting
        td = env.step_and_maybe_reset(policy(td))[1]
    assert (td["history_count"] == L).all()
    assert set(policy.memory.keys) == {"history_observation", "history_action", "history_count"}
    assert set(policy.memory.spec(old).keys()) == set(policy.memory.keys)
    before = policy(td.clone())  # old weights on this step
    old.load_state_dict(new.state_dict())  # the publish, as a collector worker loads it
    policy.generator.manual_seed(0)
    after = policy(td.clone())
    fresh = _policy(new)(td.clone())
    assert torch.equal(after["search_policy"], fresh["search_policy"])
    assert torch.equal(after["root_value"], fresh["root_value"])
    assert not torch.equal(before["root_value"], after["root_value"])
