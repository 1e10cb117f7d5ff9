"""The Dagster layer: thin wrappers that call ``pack_assets.core`` and attach metadata for the UI."""
