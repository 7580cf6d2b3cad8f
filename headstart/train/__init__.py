"""Training draft heads on a frozen target: one accelerate loop (`train`), pure losses, data checks.

`train(cfg)` runs a TrainConfig (see recipes/*.yaml); `plan(cfg)` checks a recipe against
its target and data without computing anything.
"""

from headstart.train.config import DataConfig, LoraConfig, OptimConfig, TrainConfig
from headstart.train.data import TrainData

__all__ = ["DataConfig", "LoraConfig", "OptimConfig", "TrainConfig", "TrainData"]
