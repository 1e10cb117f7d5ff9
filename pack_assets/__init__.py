"""pack_assets: offline sequence packing for multimodal training data."""

__version__ = "0.1.0"
