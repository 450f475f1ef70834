"""raycl: contrastive training with hard negatives mined in parallel on Ray."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["mine_dense_negatives", "mine_negatives"]


def __getattr__(name: str) -> Any:  # PEP 562: ``import raycl`` stays light; the library call loads on first use
    if name == "mine_negatives":
        from raycl.distributed.negatives_api import mine_negatives

        return mine_negatives
    if name == "mine_dense_negatives":
        from raycl.distributed.dense_api import mine_dense_negatives

        return mine_dense_negatives
    raise AttributeError(f"module 'raycl' has no attribute {name!r}")
