"""Optional parts of tvmsched and the pip extras that bring them (pyproject.toml [project.optional-dependencies]).

Compiling with default schedules, running and serving need none of them; each part below checks for its extra
where it starts, so a missing one is one `error:` line naming the extra, not an ImportError deep inside TVM.
"""

from __future__ import annotations

import importlib.util

from tvmsched.errors import TvmschedError

# extra -> the modules it brings that tvmsched imports (their pip packages are listed in pyproject.toml)
EXTRAS: dict[str, tuple[str, ...]] = {
    "tune": ("xgboost", "tornado", "cloudpickle"),  # MetaSchedule's search: its cost model, its builder/runner pools
    "db": ("psycopg", "httpx"),  # PostgreSQL tuning databases, the database service's client (SQLite: nothing more)
    "collectives": ("torch",),  # torch.distributed: the collectives' agent and process groups
    "models": ("torch",),  # exporting the real architectures (tvmsched models build resnet50, ...)
}


def missing(extra: str) -> list[str]:
    """The modules of `extra` that are not installed here."""
    return [module for module in EXTRAS[extra] if importlib.util.find_spec(module) is None]


def require(extra: str, what: str) -> None:
    """Raise one TvmschedError naming `extra` when `what` (e.g. "tuning") needs a module of it that is missing."""
    absent = missing(extra)
    if absent:
        raise TvmschedError(f"{what} needs tvmsched's '{extra}' extra ({', '.join(absent)} not installed): "
                            f"pip install 'tvmsched[{extra}]'")
