"""Teacher-student residual networks (paper §4, App. C): models, the batched trainer, sweeps, analysis.

- :mod:`depthlib.toy.models`    teacher (continuous ρ) and student definitions, training variants
- :mod:`depthlib.toy.engine`    :class:`BatchedStudents`, one engine training a whole sweep at once
- :mod:`depthlib.toy.reference` the plain one-student-at-a-time loop (numerical reference, baseline)
- :mod:`depthlib.toy.sweep`     profiles (smoke | cpu | paper), resumable cached sweeps
- :mod:`depthlib.toy.shards`    a sweep as one shard per ρ on an executor, merged bit for bit into the serial run
- :mod:`depthlib.toy.analysis`  α_ℓ fits, α_ℓ against training step, hidden-state signatures
"""
import os

# Before torch loads OpenMP: with 2 spinning OpenMP threads on a busy 2-core machine every small op stalls
# (smoke sweep measured 62 s instead of 9.7 s; toy-performance.md §0). Passive waiting costs nothing when idle.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from depthlib.runtime import steady_malloc  # noqa: E402

steady_malloc()   # a long run otherwise spends a third of its time faulting freed memory back in (runtime.py)

from depthlib.toy.engine import BatchedStudents, StudentSpec  # noqa: E402
from depthlib.toy.models import (  # noqa: E402
    VARIANTS,
    ToyShape,
    TrainConfig,
    derive_seed,
    init_student,
    make_teacher,
    variant,
)

__all__ = ["BatchedStudents", "StudentSpec", "ToyShape", "TrainConfig", "VARIANTS", "derive_seed",
           "init_student", "make_teacher", "variant"]
