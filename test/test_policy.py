import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.data import Categorical, OneHot
from torchrl.envs import GymEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
from torchrl_muzero.modules import MuZeroMLPModel


def _model(A=2):
    torch.manual_seed(0)
    return MuZeroMLPModel((4,), A, latent_dim=16, hidden_dim=16, zero_init_heads=False)


def test_policy_in_a_torchrl_collector():
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    policy = MCTSPolicy(_model(), MCTSConfig(num_simulations=6), env.action_spec,
                        generator=torch.Generator().manual_seed(0))
    collector = Collector(env, policy, frames_per_batch=16, total_frames=32)
    try:
        for batch in collector:
            assert batch["action"].shape == (16, 2)
            assert (batch["action"].sum(-1) == 1).all()  # one-hot, as the spec wants
            assert batch["search_policy"].shape == (16, 2)
            assert torch.allclose(batch["search_policy"].sum(-1), torch.ones(16))
            assert batch["root_value"].shape == (16,)
            # the action taken was visited by the search
            taken = batch["action"].argmax(-1)
            assert (batch["search_policy"].gather(-1, taken[:, None]) > 0).all()
    finally:
        collector.shutdown()


def test_action_encoding_follows_spec_and_batch_dims():
    model = _model(3)
    td = TensorDict({"observation": torch.randn(2, 5, 4)}, [2, 5])
    out = MCTSPolicy(model, MCTSConfig(num_simulations=4), Categorical(3))(td.clone())
    assert out["action"].shape == (2, 5) and out["action"].dtype == torch.int64
    assert out["search_policy"].shape == (2, 5, 3) and out["root_value"].shape == (2, 5)
    out = MCTSPolicy(model, MCTSConfig(num_simulations=4), OneHot(3))(td.clone())
    assert out["action"].shape == (2, 5, 3)
    out = MCTSPolicy(model, MCTSConfig(num_simulations=4))(td.clone())
    assert out["action"].shape == (2, 5)
    with pytest.raises(ValueError, match="3 actions but the model has 2|2 actions"):
        MCTSPolicy(_model(2), action_spec=OneHot(3))


def test_policy_is_greedy_under_deterministic_exploration():
    model = _model(4)
    td = TensorDict({"observation": torch.randn(64, 4)}, [64])
    policy = MCTSPolicy(model, MCTSConfig(num_simulations=12, temperature=1.0),
                        generator=torch.Generator().manual_seed(0))
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        a = policy(td.clone())
        b = policy(td.clone())
    assert torch.equal(a["action"], b["action"])
    assert torch.equal(a["action"], a["search_policy"].argmax(-1))
    c = policy(td.clone())
    assert not torch.equal(c["action"], c["search_policy"].argmax(-1))  # samples with temperature 1


def test_policy_reads_action_mask_and_needs_no_grad():
    model = _model(3)
    mask = torch.tensor([[False, True, False]]).expand(8, 3)
    td = TensorDict({"observation": torch.randn(8, 4), "action_mask": mask}, [8])
    out = MCTSPolicy(model, MCTSConfig(num_simulations=10), Categorical(3))(td)
    assert (out["action"] == 1).all()
    assert not out["search_policy"].requires_grad and not out["root_value"].requires_grad
    assert model.training  # the policy restores the model's mode


def test_policy_rejects_wrong_observation_shape():
    td = TensorDict({"observation": torch.randn(8, 3)}, [8])
    with pytest.raises(ValueError, match="observations of shape"):
        MCTSPolicy(_model())(td)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_policy_device_follows_model():
    model = _model().cuda()
    td = TensorDict({"observation": torch.randn(8, 4)}, [8])
    out = MCTSPolicy(model, MCTSConfig(num_simulations=8))(td)
    assert out["action"].device.type == "cpu" and out["search_policy"].device.type == "cpu"
