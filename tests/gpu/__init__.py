# The GPU fixtures' builds compile their packages on this many workers: with -n 8 on the 16-core H100 host their
# serial compiles were the suite's critical path (code2wav's fixture 158 s, the VoxCPM2 LM's 136 s: gpu_suite run4).
GPU_BUILD_JOBS = 4
