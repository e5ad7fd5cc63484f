"""Model plumbing shared by the probes (chapter 2) and the causal tracer (chapter 4).

- :mod:`~depthlib.models.arch`     where the blocks, embedding, final norm, head, MLP and attention of each
                                   architecture family live (one table keyed on ``config.model_type``)
- :mod:`~depthlib.models.loading`  :func:`load_model`: the offline GGUF models (converted once into the cache),
                                   local Hugging Face folders and hub ids
- :mod:`~depthlib.models.hooks`    :func:`hooks`: forward (pre-)hooks registered for a ``with`` block and always
                                   removed
"""
from __future__ import annotations

from depthlib.models.arch import (
    Arch,
    arch_of,
    block_input,
    block_output,
    replace_block_input,
    supported_architectures,
)
from depthlib.models.hooks import hooks
from depthlib.models.loading import (
    OFFLINE_MODELS,
    OfflineModel,
    available_offline_models,
    converted_model_dir,
    ensure_converted,
    load_model,
)

__all__ = ["OFFLINE_MODELS", "Arch", "OfflineModel", "arch_of", "available_offline_models", "block_input",
           "block_output", "converted_model_dir", "ensure_converted", "hooks", "load_model", "replace_block_input",
           "supported_architectures"]
