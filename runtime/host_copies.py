"""Small per-step host↔device copies that do not make the host wait for the GPU.

A copy from pageable host memory to the device makes CUDA synchronise the stream before it starts, and a copy to
pageable host memory returns only once it (and all the work before it) has run. A decode loop that copies its row
positions in, or its stop flags out, that way never runs ahead of the GPU: the GPU idles for the host's launch
work at every such copy (H100, VoxCPM2 LM steps: the runtime's `step` took 0.12-0.35 ms more than the bare graph
replay, `step_ms` vs `replay_ms` in bench/results/nvidia-h100/decode_stages*.json). Through pinned (page-locked)
memory both directions are asynchronous; torch's caching host allocator keeps a pinned block from being reused
until the copies that used it have run, so the staging needs no bookkeeping here. Off CUDA: plain copies.
(With it, the VoxCPM2 decode loop's step on an H100 took the sum of its stages' times, 6.91 vs 6.92 ms at B=1,
bench/results/nvidia-h100/voxcpm2__decode_loop.json; before it, on the H200, 8.61 vs 8.51 ms.)"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` (host) on `device`, without a stream synchronisation on CUDA."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def copy_to_device(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst.copy_(src)` for a host `src` and a device `dst`, without a stream synchronisation on CUDA."""
    if dst.device.type != "cuda":
        dst.copy_(src)
    else:
        dst.copy_(src.pin_memory(), non_blocking=True)


class PendingHost:
    """A device tensor on its way to the host: the copy is queued at construction, `wait()` returns the host
    tensor once it has arrived (at once when the GPU is already past it). On CPU: a plain tensor.

    `again(t)` queues the next copy of a tensor of the same shape and dtype into the same pinned buffer behind the
    same event, for a readback repeated every call (the input checks' flags): no pinned allocation and no event
    created per call. The host tensor `wait()` returned is then overwritten, so read it before calling `again`."""

    def __init__(self, t: torch.Tensor) -> None:
        self._event = None
        self._pending = False
        if t.device.type != "cuda":
            self._host = t.detach().clone()
            return
        self._host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        self._event = torch.cuda.Event()
        self.again(t)

    def again(self, t: torch.Tensor) -> PendingHost:
        if tuple(t.shape) != tuple(self._host.shape) or t.dtype != self._host.dtype:
            raise ValueError(
                f"PendingHost.again: {tuple(t.shape)} {t.dtype}, the buffer is "
                f"{tuple(self._host.shape)} {self._host.dtype}"
            )
        if self._event is None:  # CPU
            self._host.copy_(t.detach())
            return self
        # a copy still in flight into the buffer is ordered before this one on the stream: the buffer ends with t
        self._host.copy_(t.detach(), non_blocking=True)
        self._event.record(torch.cuda.current_stream(t.device))
        self._pending = True
        return self

    def wait(self) -> torch.Tensor:
        if self._pending:
            self._event.synchronize()
            self._pending = False
        return self._host
