"""fp32 stages run with TF32 off (cuDNN enables it for fp32 convolutions by default) and restore the flags."""

import torch

from ttsaot.runtime.stage import strict_fp32


def test_strict_fp32_disables_and_restores_tf32():
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, True
    try:
        with strict_fp32(True):
            assert torch.backends.cudnn.allow_tf32 is False
            assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cudnn.allow_tf32 is True and torch.backends.cuda.matmul.allow_tf32 is True
        with strict_fp32(False):
            assert torch.backends.cudnn.allow_tf32 is True     # bf16 stages leave the process flags alone
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
