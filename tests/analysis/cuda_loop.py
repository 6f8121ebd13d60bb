"""A small training-shaped loop on a CUDA device, profiled by profctx in step mode: the run under ``data/cuda_run``.

Run where a GPU is (it is not run by the tests, which read the trace it made)::

    PYTHONPATH=. python tests/analysis/cuda_loop.py --save DIR

Steps 1-3, profiled window ``3:4`` (step 3; steps 1 and 2 warm cuBLAS and the caching allocator up).
Per step:

- ``rollout``: eight matrix products launched back to back with no wait: most of their kernels run
  after the role's range has closed, during ``actor_update``;
- ``actor_update``: a forward and backward pass (autograd runs the backward on a device thread of
  its own, which draws no role) and an optimizer step, then a host-to-device copy;
- in the step, in no role: one elementwise kernel, then a device synchronisation.
"""

from __future__ import annotations

import argparse

import torch

import profctx


def main() -> None:
    """Run the loop described in the module docstring."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    x = torch.randn(1024, 1024, device=device)
    w = torch.randn(1024, 1024, device=device, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=1e-3)
    host = torch.randn(1024, 1024).pin_memory()
    profctx.configure(steps="3:4", mode="step", ranks="all", save_path=args.save)
    for step in range(1, 4):
        with profctx.profile_step(step):
            with profctx.profile_step(role="rollout"):
                y = x
                for _ in range(8):
                    y = torch.tanh(y @ x)
            with profctx.profile_step(role="actor_update"):
                loss = (y @ w).square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                x.copy_(host, non_blocking=True)
            x.mul_(0.5)
            torch.cuda.synchronize()
    profctx.flush(120)


if __name__ == "__main__":
    main()
