from torchrl_muzero.envs.factory import check_env_id, env_spaces, make_env

__all__ = ["make_env", "check_env_id", "env_spaces"]
