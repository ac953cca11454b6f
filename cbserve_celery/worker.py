"""The app built from the environment: `celery -A cbserve_celery.worker worker --pool threads`.

Clients import it too, to call the tasks: `from cbserve_celery.worker import embed, generate`.
"""

from __future__ import annotations

from celery import Task

from cbserve_celery.app import GENERATE_TASK, make_app
from cbserve_celery.embedding import EMBED_TASK
from cbserve_celery.settings import CelerySettings

app = make_app(CelerySettings())
generate: Task = app.tasks[GENERATE_TASK]
embed: Task = app.tasks[EMBED_TASK]
