"""The API application built from the environment: ``uvicorn api.app:app``.

``agora-pg api`` serves the same app with the signal handling of the worker; use
this module when a process manager or another ASGI server wants an import path.
"""

import os

from agora_pg.api import create_app
from agora_pg.settings import load_settings

app = create_app(load_settings(os.environ))
