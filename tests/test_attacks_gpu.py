"""The attack candidates of tests/candidates/attacks on a CUDA GPU, where the candidate has a CUDA context, Triton
compiles for real (no interpreter) and outputs come back through lent device memory: each is rejected, through the
whole pipeline and with the static stage bypassed (so the runtime layers, the walls and the parent are shown to
hold on their own), and every check ends with a verdict well inside its timeout. The honest candidate is accepted both
ways, so the layers refuse nothing an honest kernel does. The walls_* attacks are driven through the zygote directly
by tests/test_walls.py; on a GPU they run there with CRUCIBLE_TEST_DEVICE=cuda like this file."""
import time
from pathlib import Path

import pytest

from sandbox import harness as harness_mod
from sandbox.harness import CheckOptions, Harness
from sandbox.records import Verdict
from tests.conftest import needs_gpu
from tests.test_redteam import EXPECTED as REDTEAM

HERE = Path(__file__).parent
ATTACKS = HERE / "candidates" / "attacks"
RMSNORM = HERE.parent / "tasks" / "rmsnorm_fwd.py"
ROW_MEAN = HERE / "tasks" / "row_mean.py"
TIMEOUT_S, GRACE_S = 30.0, 15.0
# The static stage is what stops these: without it they are plain Python, not a test of the runtime layers.
RUNTIME_LAYERS = ("runtime_", "redteam_", "parent_")
FILES = sorted(p.name for p in ATTACKS.glob("*.py") if not p.name.startswith("walls_"))

pytestmark = [pytest.mark.gpu, needs_gpu]


def _task(name: str) -> Path:
    if name in REDTEAM:
        return REDTEAM[name][0]
    return ROW_MEAN if name.startswith("parent_") else RMSNORM


@pytest.fixture(scope="module")
def harness():
    with Harness("cuda") as h:
        yield h


def _check(harness, task, candidate, *, static: bool):
    t0 = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        if not static:
            mp.setattr(harness_mod.static, "check_source", lambda source, filename="": None)
        result = harness.check(task, candidate, CheckOptions(timeout_s=TIMEOUT_S, timing=False))
    elapsed = time.monotonic() - t0
    assert elapsed < TIMEOUT_S + GRACE_S, f"{Path(candidate).name}: the check took {elapsed:.1f} s"
    return result


@pytest.mark.parametrize("name", FILES)
def test_attack_is_rejected_through_the_whole_pipeline(harness, name):
    result = _check(harness, _task(name), ATTACKS / name, static=True)
    assert result.verdict is Verdict.REJECTED, f"{name} accepted: {result.message}"


@pytest.mark.parametrize("name", [f for f in FILES if f.startswith(RUNTIME_LAYERS)])
def test_attack_is_rejected_by_the_runtime_layers_alone(harness, name):
    result = _check(harness, _task(name), ATTACKS / name, static=False)
    assert result.verdict is Verdict.REJECTED, f"{name} accepted without the static stage: {result.message}"


@pytest.mark.parametrize("static", [True, False], ids=["whole pipeline", "static bypassed"])
def test_honest_candidates_are_accepted_after_the_attacks(harness, static):
    for task, candidate in ((RMSNORM, HERE / "candidates" / "rmsnorm_honest.py"),
                            (ROW_MEAN, HERE / "candidates" / "row_mean_honest.py")):
        result = _check(harness, task, candidate, static=static)
        assert result.verdict is Verdict.ACCEPTED, f"{candidate.name}: {result.message}"
