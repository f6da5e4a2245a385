"""runtime/host_copies.py: the per-step control copies give the values a plain copy gives (CPU here; on CUDA the
same calls go through pinned memory, exercised by the LM-stage GPU tests and the decode-loop bench)."""

from __future__ import annotations

import pytest
import torch

from ttsaot.runtime.host_copies import PendingHost, copy_to_device, to_device


def test_to_device_and_copy_to_device_copy_the_values():
    host = torch.arange(6, dtype=torch.int64)
    out = to_device(host, torch.device("cpu"))
    assert torch.equal(out, host)
    dst = torch.zeros(6, dtype=torch.int64)
    copy_to_device(dst, host)
    assert torch.equal(dst, host)


def test_pending_host_is_a_snapshot_at_construction():
    t = torch.tensor([0, 1, 1])
    pending = PendingHost(t)
    t.zero_()  # the device tensor changes after the copy was queued (the next step's argmax)
    assert pending.wait().tolist() == [0, 1, 1]
    assert pending.wait().tolist() == [0, 1, 1]  # waiting twice is fine


def test_pending_host_again_reuses_its_buffer_and_snapshots_each_copy():
    t = torch.tensor([True, False])
    pending = PendingHost(t)
    host = pending.wait()
    assert host.tolist() == [True, False]
    t.fill_(False)
    again = pending.again(t)
    assert again is pending and again.wait() is host  # one buffer, no allocation per call
    t.fill_(True)  # changed after the copy was queued
    assert pending.wait().tolist() == [False, False]
    with pytest.raises(ValueError, match="PendingHost.again"):
        pending.again(torch.zeros(3, dtype=torch.bool))
