"""The looped student of chapter 3's toy: one residual block applied ℓ times with step 1/ℓ.

A looped student of depth ℓ is the toy's residual MLP block (:mod:`depthlib.toy.models`) with **one** set of weights
(W_up, b_up and a vector-field down-projection V), applied ℓ times::

    h_{k+1} = h_k + (1/ℓ) · V · ReLU(W_up · RMSNorm(h_k) + b_up)²,   k = 0 … ℓ−1

i.e. ℓ explicit-Euler steps of the autonomous flow dh/dt = f_V(h) over unit time (the paper's procedural assembly
with one weight-tied block). Its parameter count does not depend on ℓ. The per-application down-projection is
W_down = V/ℓ, so the depth-2ℓ student with W_down halved integrates the same flow with half the step (:func:`halve`);
the tied teacher's own block with W_down × ℓ*/ℓ is its flow in ℓ steps (:func:`euler_block`).

:class:`SharedBlock` trains one looped student in chapter 3's batched engine with every layer holding the shared
block: the gradient of the shared weights is the sum of the per-application gradients (exact for tied weights) and one
Adam update is applied to (W_up, b_up, V) and written back into every layer. :mod:`depthlib.compose.looped_certified`
trains and certifies these students.
"""
from __future__ import annotations

import torch

from depthlib.errors import InputError
from depthlib.toy import converged
from depthlib.toy.models import StudentWeights, TeacherWeights

#: inputs of the signature measurements (chapter 3's students are measured on fixed Gaussian inputs too)
SIGNATURE_INPUTS = 2048


def looped_weights(block: StudentWeights, depth: int) -> StudentWeights:
    """The depth-``depth`` network of a looped student: the one block (W_up, b_up, per-application W_down) in every
    layer."""
    if block.W_up.shape[0] != 1:
        raise InputError(f"a looped student has one block, got {block.W_up.shape[0]}")
    return StudentWeights(block.W_up.repeat(depth, 1, 1), block.b_up.repeat(depth, 1), block.W_down.repeat(depth, 1, 1),
                          None if block.head is None else block.head.clone())


def halve(block: StudentWeights) -> StudentWeights:
    """The warm start of depth 2ℓ from a looped student of depth ℓ: the same block with its down-projection halved
    (the same flow, half the step)."""
    return StudentWeights(block.W_up.clone(), block.b_up.clone(), block.W_down / 2,
                          None if block.head is None else block.head.clone())


def euler_block(teacher: TeacherWeights, depth: int) -> StudentWeights:
    """The tied teacher's flow as a looped student of ``depth`` steps: its one block with W_down × ℓ*/ℓ and its fixed
    head (:func:`depthlib.toy.converged.euler_student`, one block of it)."""
    w = converged.euler_student(teacher, depth)
    return StudentWeights(w.W_up[:1].clone(), w.b_up[:1].clone(), w.W_down[:1].clone(), w.head)


def n_parameters(block: StudentWeights) -> int:
    """Trained parameters of a looped student (the teacher's fixed head is given, not trained): one block."""
    return int(block.W_up.numel() + block.b_up.numel() + block.W_down.numel())


class SharedBlock:
    """One student of depth ℓ whose ℓ layers share one block, mixed into one of chapter 3's engines (a subclass of
    :class:`depthlib.toy.engine.BatchedStudents`, after this class in the bases).

    The forward and backward passes are the engine's (ℓ layers, each holding the shared block); :meth:`_adam` sums
    the layers' gradients into the shared weights' gradient, takes one Adam step on (W_up, b_up, V = ℓ·W_down) with
    the engine's fused kernel, and writes the block back into every layer."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.K != 1 or self.per_block != 1 or self.head is not None:
            raise InputError("the looped engine trains one Euler student with the teacher's fixed head")
        self.depth = int(self.specs[0].depth)
        self._shared = [self.Wu[0].contiguous().clone(), self.b[0].contiguous().clone(),
                        self.Wd[0].contiguous() * self.depth]
        self._m = [torch.zeros_like(p) for p in self._shared]
        self._v = [torch.zeros_like(p) for p in self._shared]
        self._step = torch.zeros((), dtype=self.dtype, device=self.device)
        self._broadcast()

    def _broadcast(self) -> None:
        Wu, b, V = self._shared
        for j in range(self.depth):
            self.Wu[j].copy_(Wu)
            self.b[j].copy_(b)
            self.Wd[j].copy_(V / self.depth)

    def _adam(self) -> None:
        # the fused kernel walks params and grads as flat memory: both are contiguous (a transposed clone is not)
        grads = [torch.stack([g[j] for j in range(self.depth)]).sum(0) for g in (self.gWu, self.gb, self.gWd)]
        grads[2].div_(self.depth)                       # dL/dV = Σ_j dL/dW_down_j · (1/ℓ)
        beta1, beta2 = self.train.betas
        lr = self.train.base_lr(self.depth) * self.train.schedule(self.step_count, self.total_steps)
        self._step.add_(1)
        torch._fused_adam_(self._shared, grads, self._m, self._v, [], [self._step] * 3, lr=lr, beta1=beta1,
                           beta2=beta2, weight_decay=0.0, eps=self.train.eps, amsgrad=False, maximize=False)
        self._broadcast()

    def load_block(self, block: StudentWeights) -> None:
        """Start from a looped student's block (per-application W_down for this depth)."""
        self._shared = [t.to(self.device).contiguous().clone() for t in
                        (block.W_up[0].T[None], block.b_up[0][None, None], block.W_down[0].T[None] * self.depth)]
        self._broadcast()

    def export_block(self) -> StudentWeights:
        """The block (per-application W_down = V/ℓ) with the fixed head, in ``nn.Linear`` layout, on the CPU."""
        Wu, b, V = (t.cpu() for t in self._shared)
        return StudentWeights(Wu[0].T[None].clone(), b[0, 0][None].clone(), (V[0] / self.depth).T[None].clone(),
                              self.fixed_head[0].T.cpu().clone())


__all__ = ["SIGNATURE_INPUTS", "SharedBlock", "euler_block", "halve", "looped_weights", "n_parameters"]
