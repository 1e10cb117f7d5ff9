"""Celery settings for the workers (`celery -A dagster_celery.app worker` imports this module by name
when its directory is on PYTHONPATH); the broker must be the one the instance's run launcher sends to."""

import os

broker_url = os.environ.get("PACK_ASSETS_CELERY_BROKER", "redis://127.0.0.1:6379/0")
result_backend = os.environ.get("PACK_ASSETS_CELERY_BACKEND", "redis://127.0.0.1:6379/1")
# one run at a time per worker process: a shard run is one core's work
worker_prefetch_multiplier = 1
task_acks_late = True
