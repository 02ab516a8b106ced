"""The plan in the words of other training frameworks: Megatron-LM arguments, a torchtitan 0.3.0
recipe module or a torchtitan 0.2.x TOML job config (``autopipe config PLAN --for
megatron|torchtitan|torchtitan-main|torchtitan-0.2``)."""

from autopipe.config.check import check_layers, check_parts
from autopipe.config.megatron import megatron_args
from autopipe.config.titan_recipe import torchtitan_recipe
from autopipe.config.torchtitan import torchtitan_parts, torchtitan_toml

__all__ = ["check_layers", "check_parts", "megatron_args", "torchtitan_parts", "torchtitan_recipe", "torchtitan_toml"]
