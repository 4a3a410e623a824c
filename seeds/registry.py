"""Which seed kernel starts the search for which task.

Each seed file in seeds/ declares, at module level, a literal

    CRUCIBLE_SEED = {"name": "rmsnorm", "tasks": ["rmsnorm_fwd.py", "rmsnorm_bwd.py"], "ops": ["RMSNorm fwd", ...]}

The registry reads it with `ast` (no import, so listing seeds costs nothing and needs no GPU).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SEEDS_DIR = Path(__file__).resolve().parent
TASKS_DIR = SEEDS_DIR.parent / "tasks"


@dataclass(frozen=True)
class Seed:
    name: str
    path: Path
    tasks: tuple[str, ...]  # task file names in tasks/
    ops: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"name": self.name, "path": str(self.path), "tasks": list(self.tasks), "ops": list(self.ops)}


def all_seeds() -> list[Seed]:
    seeds = []
    for path in sorted(SEEDS_DIR.glob("*.py")):
        if path.name.startswith("_") or path.name == "registry.py":
            continue
        decl = _declaration(path)
        if decl is not None:
            seeds.append(Seed(name=decl["name"], path=path, tasks=tuple(decl["tasks"]), ops=tuple(decl.get("ops", ()))))
    return seeds


def seed_for_task(task_path: str | Path) -> Seed | None:
    """The seed registered for a task, matched on the task's file name."""
    name = Path(task_path).name
    for seed in all_seeds():
        if name in seed.tasks:
            return seed
    return None


def _declaration(path: Path) -> dict | None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CRUCIBLE_SEED" for t in node.targets):
            value = ast.literal_eval(node.value)
            if not isinstance(value, dict) or "name" not in value or "tasks" not in value:
                raise ValueError(f"{path.name}: CRUCIBLE_SEED must be a dict with 'name' and 'tasks'")
            return value
    return None
