"""Runtime buffer policies: fp32 stages run with TF32 off; CPU package inputs carry slack after their end."""

import torch

from ttsaot.runtime.stage import fp32_mode


def test_exact_fp32_mode_disables_and_restores_tf32():
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, True
    try:
        with fp32_mode(True, tf32=False):
            assert torch.backends.cudnn.allow_tf32 is False
            assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cudnn.allow_tf32 is True and torch.backends.cuda.matmul.allow_tf32 is True
        with fp32_mode(False, tf32=False):
            assert torch.backends.cudnn.allow_tf32 is True  # bf16 stages leave the process flags alone
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def test_cpu_inputs_are_handed_over_with_slack():
    from ttsaot.runtime.stage import CPU_INPUT_SLACK, _with_slack

    dirty = torch.full((30 + CPU_INPUT_SLACK,), 7, dtype=torch.int64)
    del dirty  # (the allocator hands such a block back: without the zeroing its 7s show through)
    t = _with_slack((2, 3, 5), torch.int64, torch.device("cpu"))
    assert t.shape == (2, 3, 5) and t.is_contiguous()
    assert t.untyped_storage().nbytes() >= (30 + CPU_INPUT_SLACK) * 8
    past = torch.empty(0, dtype=torch.int64).set_(t.untyped_storage(), 30, (CPU_INPUT_SLACK,))
    assert not past.any()  # the slack is zeros: what a tail loop reads past the end is the same at every call
