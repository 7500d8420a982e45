"""Method modules. Each file here registers its method(s) by name when imported.

To add a method, create a file in this folder whose ``nn.Module`` is decorated with
``@attnprune.methods.registry.register(name, kind=...)``. Every module in the folder is imported
by walking the package, so there is no central list to edit.
"""

import importlib
import pkgutil

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
