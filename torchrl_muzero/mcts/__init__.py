from torchrl_muzero.mcts.config import MCTSConfig
from torchrl_muzero.mcts.tree import Tree, allocate_tree
from torchrl_muzero.mcts.search import SearchResult, search, search_from_root, select_action
from torchrl_muzero.mcts.policy import MCTSPolicy

__all__ = ["MCTSConfig", "Tree", "allocate_tree", "SearchResult", "search", "search_from_root", "select_action", "MCTSPolicy"]
from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig, gumbel_muzero_search, gumbel_search

__all__ += ["GumbelMCTSConfig", "gumbel_muzero_search", "gumbel_search"]
from torchrl_muzero.mcts.stochastic import stochastic_muzero_search, stochastic_search

__all__ += ["stochastic_muzero_search", "stochastic_search"]
