"""raycl: contrastive training with hard negatives mined in parallel on Ray."""

__version__ = "0.1.0"
