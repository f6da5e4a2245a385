import pytest

from ttsaot.builder.buckets import BucketPlan, StreamingConfig, batch_sizes, frame_sizes, powers_of_two


def test_streaming_windows_fish_pattern():
    # Fish: 4-frame first chunks with all history as context until 25, then 25 + 25 context.
    st = StreamingConfig(chunk_frames=25, left_context_frames=25, first_chunk_frames=4, nonstreaming_chunk_frames=0)
    assert st.window_sizes() == [4, 8, 12, 16, 20, 24, 25, 50]


def test_streaming_windows_qwen_defaults():
    st = StreamingConfig(chunk_frames=25, left_context_frames=25, first_chunk_frames=0, nonstreaming_chunk_frames=300)
    assert st.window_sizes() == [25, 50, 325]


def test_frame_sizes_adds_powers_of_two_between_the_windows():
    st = StreamingConfig(25, 25, 0, 300)
    assert frame_sizes(st) == (25, 32, 50, 64, 128, 256, 325)  # none below the smallest window
    assert frame_sizes(StreamingConfig(4, 0, 0, 46)) == (4, 8, 16, 32, 46)  # from POW2_MIN_FRAMES up
    assert frame_sizes(st, pow2=False) == (25, 50, 325)
    assert frame_sizes(st, explicit=(50, 25, 25)) == (25, 50)


def test_a_streams_ramp_windows_pad_to_the_powers_of_two_and_the_chunk():
    """Fish: the first chunk (4) keeps its bucket; 12 pads to 16, 20 and 24 to the 25-frame chunk. Without the
    powers of two every window keeps its own."""
    st = StreamingConfig(chunk_frames=25, left_context_frames=25, first_chunk_frames=4, nonstreaming_chunk_frames=0)
    assert frame_sizes(st) == (4, 8, 16, 25, 32, 50)
    assert frame_sizes(st, pow2=False) == (4, 8, 12, 16, 20, 24, 25, 50)


def test_batch_sizes():
    assert batch_sizes(8) == (1, 2, 4, 8)
    assert batch_sizes(6) == (1, 2, 4, 6)  # the admitted maximum is always a bucket
    assert batch_sizes(1) == (1,)
    assert batch_sizes(8, (4, 1)) == (1, 4)
    with pytest.raises(ValueError):
        batch_sizes(0)


def test_plan_cross_product_and_keys():
    plan = BucketPlan({"batch": (1, 4), "frames": (25, 50)})
    assert plan.buckets() == [
        {"batch": 1, "frames": 25},
        {"batch": 1, "frames": 50},
        {"batch": 4, "frames": 25},
        {"batch": 4, "frames": 50},
    ]
    assert BucketPlan.key({"batch": 4, "frames": 50}) == "b4_f50"


def test_powers_of_two():
    assert powers_of_two(20) == [1, 2, 4, 8, 16]
    assert powers_of_two(7, start=2) == [2, 4]


def test_invalid_streaming_config():
    with pytest.raises(ValueError):
        StreamingConfig(chunk_frames=0)
    with pytest.raises(ValueError):
        StreamingConfig(left_context_frames=-1)


def test_plan_cap_leaves_out_only_large_batches_at_long_windows():
    plan = BucketPlan({"batch": (1, 2, 4), "frames": (25, 50, 325)}, max_batch_frames=200)
    assert [BucketPlan.key(b) for b in plan.buckets()] == [
        "b1_f25",
        "b1_f50",
        "b1_f325",
        "b2_f25",
        "b2_f50",
        "b4_f25",
        "b4_f50",
    ]  # one row at every window is always kept, however long
    assert len(BucketPlan(plan.axes, max_batch_frames=None).buckets()) == 9


@pytest.mark.parametrize(
    ("family", "stage", "cap", "left_out"),
    [
        # the 300-frame one-shot chunk (+25 context) runs one row at a time; 4 streams × 50-frame windows batch
        ("qwen3-tts-12hz", "code2wav", 325, ["b2_f256", "b2_f325", "b4_f128", "b4_f256", "b4_f325"]),
        ("fish-s2-pro", "dac_decoder", 200, []),  # 4 × (25 + 25): every window batches
        ("voxcpm2", "vae_decoder", 144, []),  # 4 × (12 + 24)
    ],
)
def test_default_codec_plans_cap_batch_times_frames(family, stage, cap, left_out):
    from ttsaot.builder.families import get_family

    fam = get_family(family)
    spec = fam.specs(fam.options(), [stage])[0]
    assert spec.plan.max_batch_frames == cap
    kept = {BucketPlan.key(b) for b in spec.plan.buckets()}
    every = {
        BucketPlan.key({"batch": b, "frames": f}) for b in spec.plan.axes["batch"] for f in spec.plan.axes["frames"]
    }
    assert sorted(every - kept) == sorted(left_out)
    uncapped = fam.specs(fam.options(max_batch_frames=0), [stage])[0]
    assert len(uncapped.plan.buckets()) == len(every)
