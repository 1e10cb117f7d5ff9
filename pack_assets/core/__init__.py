"""The pure core of pack_assets: no Dagster import anywhere below this package.

One module per stage: ``scan`` (manifest), ``tokens`` (token_lengths), ``plan`` (pack_plan),
``write`` (packed_shards), ``audit`` (audit_report); ``store`` holds the on-disk layout.
"""
