"""attnprune: spend transformer compute only where it matters, and prove it.

    import attnprune
    attnprune.patch(model, "entropy", keep_ratio=0.5, after_layer=1)
    attnprune.patch(model, "crisp", sparsity=0.8, stack=True)   # + an attention method
    attnprune.save_pretrained(model, "out/")   # HF folder + attnprune.json (+ method tensors)
    model = attnprune.from_pretrained("out/")  # rebuilt and patched, offline, no pickle
    attnprune.unpatch(model)
    attnprune.list_methods()
    q = attnprune.quantize_int8(model)   # dynamic int8 of the Linear layers, patch kept
    fast = attnprune.compile(model, lengths=(128, 256, 512))  # torch.compile per input bucket
    attnprune.sparse_ffn.apply(model)    # inference: FFN units off in a block of tokens skipped

Importing the package has no side effects: no threads set, no files written, no network.
"""

from attnprune.api import (
                           UntrainedMethodWarning,
                           aux_loss,
                           list_methods,
                           patch,
                           patch_state,
                           unpatch,
)
from attnprune.deploy import quantize_int8, sparse_ffn
from attnprune.deploy.compiled import compile
from attnprune.deploy.hub import from_pretrained, save_pretrained

__version__ = "0.1.0"
__all__ = ["UntrainedMethodWarning", "__version__", "aux_loss", "compile", "from_pretrained", "list_methods",
           "patch", "patch_state", "quantize_int8", "save_pretrained", "sparse_ffn", "unpatch"]
