"""Teacher-student residual networks (paper §4, App. C): models, the batched trainer, sweeps, analysis.

- :mod:`depthlib.toy.models`    teacher (continuous ρ) and student definitions, training variants
- :mod:`depthlib.toy.engine`    :class:`BatchedStudents`, one engine training a whole sweep at once
- :mod:`depthlib.toy.reference` the plain one-student-at-a-time loop (numerical reference, baseline)
- :mod:`depthlib.toy.sweep`     profiles (smoke | cpu | paper), resumable cached sweeps
- :mod:`depthlib.toy.shards`    a sweep as one shard per ρ on an executor, merged bit for bit into the serial run
- :mod:`depthlib.toy.analysis`  α_ℓ fits, α_ℓ against training step, hidden-state signatures
"""
from depthlib.toy.engine import BatchedStudents, StudentSpec
from depthlib.toy.models import (
    VARIANTS,
    StudentTraining,
    ToyShape,
    derive_seed,
    init_student,
    make_teacher,
    variant,
)

__all__ = ["BatchedStudents", "StudentSpec", "ToyShape", "StudentTraining", "VARIANTS", "derive_seed",
           "init_student", "make_teacher", "variant"]
