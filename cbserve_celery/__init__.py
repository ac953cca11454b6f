"""Celery tasks that run generation through the stream protocol (`celery -A cbserve_celery.worker worker`)."""
