"""The sentence-transformers module class of a saved pruned SentenceTransformer.

``attnprune.save_pretrained(st, folder)`` writes a sentence-transformers folder whose
``modules.json`` names :class:`PrunedTransformer` for the Transformer module. When
sentence-transformers builds the model from that folder, this class loads the encoder as the
stock ``Transformer`` does and then, once every module exists (``on_model_ready``), re-applies
the recipe (``attnprune.json`` and ``attnprune.safetensors`` in its folder) to the whole model:
the encoder and the Pooling modules, as ``attnprune.patch(st, ...)`` did.

This module imports sentence-transformers; nothing in ``import attnprune`` imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

from sentence_transformers.models import Transformer

from attnprune.deploy import hub

__all__ = ["PrunedTransformer"]


class PrunedTransformer(Transformer):
    """A sentence-transformers ``Transformer`` that re-applies attnprune's saved recipe to the
    model it belongs to. Without a recipe in its folder it is the stock Transformer."""

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token=None, cache_folder=None,
             revision=None, local_files_only: bool = False, **kwargs):
        module = super().load(model_name_or_path, subfolder=subfolder, token=token,
                              cache_folder=cache_folder, revision=revision,
                              local_files_only=local_files_only, **kwargs)
        if os.path.isdir(model_name_or_path):
            folder = Path(model_name_or_path) / subfolder
        else:  # a Hub repository: its files, downloaded (or cached) as the encoder's were
            from sentence_transformers.util.file_io import load_dir_path

            folder = Path(load_dir_path(model_name_or_path, subfolder, token=token,
                                        cache_folder=cache_folder, revision=revision,
                                        local_files_only=local_files_only))
        # a plain attribute (nn.Module keeps non-tensor attributes in __dict__)
        module.attnprune_folder = str(folder)
        return module

    def on_model_ready(self, model) -> None:
        super().on_model_ready(model)
        where = getattr(self, "attnprune_folder", None)  # None: built in memory, not loaded
        folder = Path(where) if where else None
        if folder is None or not (folder / hub.RECIPE).is_file():
            return
        recipe = hub.read_recipe(folder)
        if recipe["patches"]:
            hub.apply_recipe(model, recipe, folder)
