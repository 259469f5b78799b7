"""DSV4-mini model: layers, paged pools and the batch a forward step computes."""

from .batch import ForwardBatch, SeqSlice
from .kv_pools import KVPools
from .model import DSV4Mini

__all__ = ["DSV4Mini", "ForwardBatch", "KVPools", "SeqSlice"]
