"""The plan in the words of other training frameworks: Megatron-LM arguments, a torchtitan job
config (``autopipe config PLAN --for megatron|torchtitan``)."""

from autopipe.config.megatron import megatron_args
from autopipe.config.torchtitan import torchtitan_toml

__all__ = ["megatron_args", "torchtitan_toml"]
