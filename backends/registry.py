"""Cost-model registry. Entries name a module and class so heavy imports (torch) stay lazy."""

from __future__ import annotations

import importlib
from typing import Any

from backends.base import CostContext, CostModel
from simcore.errors import ConfigError

# name -> "module:factory". A factory takes (params: dict, ctx: CostContext) and returns a CostModel.
COST_MODELS: dict[str, str] = {
    "constant": "backends.constant:make_constant",
    "roofline": "backends.roofline:make_roofline",
    "profiled": "backends.profiled:make_profiled",
    "torch": "backends.torch.factory:make_torch",
}


def build_cost_model(name: str, params: dict[str, Any], ctx: CostContext) -> CostModel:
    if name not in COST_MODELS:
        raise ConfigError(
            "unknown cost model", source=ctx.source, where="cost_model.name",
            expected=f"one of {sorted(COST_MODELS)}", found=name, choices=COST_MODELS,
        )
    module_name, attr = COST_MODELS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            raise ConfigError(
                f"cost model {name!r} needs PyTorch, which is not installed "
                "(pip install -e '.[torch]' in the servesim repository)", source=ctx.source, where="cost_model.name",
            ) from None
        raise
    return getattr(module, attr)(params, ctx)
