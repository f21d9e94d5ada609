"""Loading user code by import path, with errors that say what was expected."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from agora_pg.errors import WorkerModuleError
from agora_pg.runner import WorkerPool
from agora_pg.worker import Worker

EXAMPLE = "def get_worker() -> WorkerPool: return WorkerPool().register(Worker({'send_email': send_email}))"


def import_module(name: str, search_dir: Path) -> ModuleType:
    """Import ``name`` (a dotted module path), looking in ``search_dir`` first."""
    if name.endswith(".py") or "/" in name or "\\" in name:  # a file's path: say what to write instead
        dotted = name.removesuffix(".py").replace("\\", "/").strip("/").replace("/", ".")
        raise WorkerModuleError(f"--module takes a module's dotted path, not a file: write --module {dotted}")
    if str(search_dir) not in sys.path:
        sys.path.insert(0, str(search_dir))
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and (name == error.name or name.startswith(error.name + ".")):
            raise WorkerModuleError(
                f"cannot import worker module {name!r} from {search_dir}: expected a file "
                f"{name.replace('.', '/')}.py there (run from the project folder, e.g. "
                f"`agora-pg worker --module worker`)"
            ) from None
        raise WorkerModuleError(f"importing {name!r} failed: {error}") from error
    except Exception as error:
        raise WorkerModuleError(f"importing {name!r} failed: {type(error).__name__}: {error}") from error


def load_worker(module_name: str, search_dir: Path) -> Worker | WorkerPool:
    """Import the module and call its ``get_worker()`` (a WorkerPool or a job Worker)."""
    module = import_module(module_name, search_dir)
    factory = getattr(module, "get_worker", None)
    if not callable(factory):
        raise WorkerModuleError(f"module {module_name!r} has no get_worker() function; expected: {EXAMPLE}")
    worker = factory()
    if not isinstance(worker, Worker | WorkerPool):
        raise WorkerModuleError(
            f"{module_name}.get_worker() returned {type(worker).__name__}, expected a WorkerPool or a Worker: {EXAMPLE}"
        )
    return worker
